"""Image prompts in verl's data layout: the ``images`` column in Parquet and JSON Lines,
``rlkit data prepare`` of the image task, and rows whose images are wrong."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from rlkit.cli import main as rlkit_main
from rlkit.data import load_prompt_dataset
from rlkit.data.prompt_dataset import PromptDataError, prompt_dataset_from_rows


def png(colour: tuple[int, int, int], size: int = 40) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buffer, format="PNG")
    return buffer.getvalue()


def verl_image_row(index: int, images: list, content: str = "<image>What colour is it?"):
    """A row as verl's geo3k preprocessing writes it: images as {"bytes", "path"}."""
    return {
        "data_source": "hiyouga/geometry3k",
        "prompt": [{"role": "user", "content": content}],
        "images": images,
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "red"},
        "extra_info": {"split": "train", "index": index},
    }


def test_a_verl_parquet_with_an_images_column_loads_each_rows_pictures(tmp_path):
    rows = [
        verl_image_row(0, [{"bytes": png((255, 0, 0)), "path": None}]),
        verl_image_row(
            1,
            [{"bytes": png((0, 255, 0)), "path": None}, {"bytes": png((0, 0, 255)), "path": None}],
            content="<image> and <image>: which is red?",
        ),
    ]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    dataset = load_prompt_dataset(str(path))
    assert [len(r["images"]) for r in dataset] == [1, 2]
    second = dataset[1]["images"][1]
    assert Image.open(io.BytesIO(second["bytes"])).getpixel((0, 0)) == (0, 0, 255)
    assert dataset[1]["ground_truth"] == "red"


def test_image_paths_and_pil_images_in_rows_are_stored_as_records(tmp_path):
    picture = tmp_path / "red.png"
    picture.write_bytes(png((255, 0, 0)))
    rows = [
        {
            "id": "a",
            "prompt": [{"role": "user", "content": "<image>?"}],
            "ground_truth": "red",
            "images": [str(picture)],
        },
        {
            "id": "b",
            "prompt": [{"role": "user", "content": "<image>?"}],
            "ground_truth": "red",
            "images": [Image.new("RGB", (8, 8), (255, 0, 0))],
        },
        {"id": "c", "prompt": [{"role": "user", "content": "no picture"}], "ground_truth": "x"},
    ]
    dataset = prompt_dataset_from_rows(rows, source="mixed")
    assert dataset[0]["images"] == [{"bytes": None, "path": str(picture)}]
    assert Image.open(io.BytesIO(dataset[1]["images"][0]["bytes"])).size == (8, 8)
    assert dataset[2]["images"] == []  # a text row in an image dataset


@pytest.mark.parametrize(
    "images, content, problem",
    [
        (["garbage.png"], "<image>?", "is no image format PIL can read"),
        (["missing.png"], "<image>?", "image 0: image file 'missing.png' does not exist"),
        (
            ["red.png"],
            "no placeholder",
            "the prompt has 0 <image> placeholder(s) but 1 image(s); put one <image> in the "
            "message text where each image goes",
        ),
        ([], "<image> <image>", "the prompt has 2 <image> placeholder(s) but 0 image(s)"),
        ([42], "<image>", "an image must be bytes, a path, a PIL image or {'bytes', 'path'}"),
    ],
)
def test_a_row_with_wrong_images_stops_the_load_naming_the_row(
    tmp_path, monkeypatch, images, content, problem
):
    monkeypatch.chdir(tmp_path)  # the rows name their pictures relative to it
    (tmp_path / "red.png").write_bytes(png((255, 0, 0)))
    (tmp_path / "garbage.png").write_bytes(b"not a picture")
    rows = [verl_image_row(0, ["red.png"]), verl_image_row(1, images, content)]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(PromptDataError) as info:
        load_prompt_dataset(str(path))
    message = str(info.value)
    assert f"{path}:2: " in message and problem in message, message
    assert message.endswith("fix the row or pass on_error='skip'")


def test_undecodable_image_bytes_in_parquet_name_the_row(tmp_path):
    rows = [
        verl_image_row(0, [{"bytes": png((9, 9, 9)), "path": None}]),
        verl_image_row(1, [{"bytes": b"not a picture", "path": None}]),
    ]
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(
        PromptDataError,
        match=r"row 2: image 0: image \(13 bytes\) is no image "
        r"format PIL can read",
    ):
        load_prompt_dataset(str(path))


def test_data_prepare_writes_the_image_task_as_verl_parquet_that_loads_again(tmp_path, capsys):
    out = tmp_path / "colours"
    assert (
        rlkit_main(["data", "prepare", "colour_shapes", "--out", str(out), "--split", "val"]) == 0
    )
    assert f"wrote {out / 'val.parquet'}" in capsys.readouterr().out
    table = pq.read_table(out / "val.parquet")
    assert {"prompt", "images", "reward_model", "data_source", "extra_info"} <= set(
        table.column_names
    )
    dataset = load_prompt_dataset(str(out / "val.parquet"))
    first = dataset[0]
    assert first["prompt"][0]["content"] == "<image>colour?"
    assert Image.open(io.BytesIO(first["images"][0]["bytes"])).size == (56, 56)
    assert first["ground_truth"] in ("red", "green", "blue", "yellow", "cyan", "magenta")


def test_data_prepare_refuses_image_bytes_in_json_lines(tmp_path, capsys):
    code = rlkit_main(
        [
            "data",
            "prepare",
            "colour_shapes",
            "--out",
            str(tmp_path),
            "--format",
            "jsonl",
            "--split",
            "val",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "images held as bytes cannot be written to JSON Lines; write Parquet" in err
