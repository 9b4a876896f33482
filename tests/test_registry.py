"""Behaviour of the generic name -> function registry."""

import pytest

from rlkit.registry import RegistrationError, Registry, UnknownNameError


def _make() -> Registry:
    reg = Registry("widget")

    @reg.register("alpha", aliases=("a",), paper="arXiv:0000.00000", summary="first")
    def alpha() -> int:
        return 1

    @reg.register("beta")
    def beta() -> int:
        """Second widget."""
        return 2

    return reg


def test_get_returns_function_by_name_and_alias():
    reg = _make()
    assert reg.get("alpha")() == 1
    assert reg.get("a") is reg.get("alpha")


def test_names_exclude_aliases_and_are_sorted():
    assert _make().names() == ["alpha", "beta"]


def test_describe_uses_first_docstring_line_as_default_summary():
    entries = {e.name: e for e in _make().describe()}
    assert entries["alpha"].summary == "first"
    assert entries["alpha"].paper == "arXiv:0000.00000"
    assert entries["beta"].summary == "Second widget."


def test_unknown_name_lists_known_names_and_suggests_nearest():
    with pytest.raises(UnknownNameError) as info:
        _make().get("alpah")
    msg = str(info.value)
    assert "Did you mean 'alpha'?" in msg
    assert "alpha" in msg and "beta" in msg
    assert isinstance(info.value, KeyError)


def test_registering_other_function_under_taken_name_raises():
    reg = _make()
    with pytest.raises(RegistrationError, match="already registered"):
        reg.add("alpha", lambda: 3)
    with pytest.raises(RegistrationError):
        reg.add("gamma", lambda: 3, aliases=("a",))


def test_reregistering_same_function_is_allowed():
    reg = Registry("widget")

    def f() -> int:
        return 0

    reg.add("f", f)
    reg.add("f", f)
    assert reg.names() == ["f"]


def test_dotted_path_imports_user_function():
    reg = Registry("widget")
    assert reg.get("math:sqrt")(9.0) == 3.0
    assert reg.get("os.path:join")("a", "b") == "a/b"


@pytest.mark.parametrize(
    "path, fragment",
    [
        ("no_such_mod_xyz:f", "cannot import"),
        ("math:nope", "no attribute"),
        ("math:pi", "not callable"),
    ],
)
def test_dotted_path_errors_are_clear(path, fragment):
    with pytest.raises(UnknownNameError, match=fragment):
        Registry("widget").get(path)


def test_unregister_removes_name_and_aliases():
    reg = _make()
    reg.unregister("alpha")
    assert "alpha" not in reg and "a" not in reg


LAZY = Registry("widget", home="rlkit_registry_home_test_module")


def test_home_module_is_imported_on_first_lookup(tmp_path, monkeypatch):
    (tmp_path / "rlkit_registry_home_test_module.py").write_text(
        "from tests.test_registry import LAZY\n"
        "@LAZY.register('from_home')\n"
        "def from_home():\n"
        "    return 'home'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert LAZY.get("from_home")() == "home"
