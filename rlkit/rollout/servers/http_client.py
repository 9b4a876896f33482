"""Async JSON over HTTP to rollout servers, with the two kinds of failure engines tell apart."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from rlkit.rollout.servers.errors import BadRequestError, RequestError


class HttpClient:
    """Async JSON over HTTP to rollout servers (one aiohttp session, reused).

    Args:
        request_timeout_s: total time allowed for one request.
    """

    def __init__(self, request_timeout_s: float) -> None:
        self.request_timeout_s = request_timeout_s
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), trust_env=False
            )
        return self._session

    async def post(
        self, url: str, path: str, body: dict[str, Any], timeout_s: float | None = None
    ) -> Any:
        """``POST url+path`` with a JSON body; the decoded JSON answer.

        Raises:
            RequestError: timeout, connection failure or HTTP 5xx.
            BadRequestError: HTTP 4xx (the server's message included).
        """
        return await self._request("POST", url + path, body, timeout_s)

    async def get(self, url: str, path: str, timeout_s: float | None = None) -> Any:
        """``GET url+path``; the decoded JSON answer (see :meth:`post` for errors)."""
        return await self._request("GET", url + path, None, timeout_s)

    async def _request(self, method: str, full_url: str, body: Any, timeout_s: float | None) -> Any:
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.request_timeout_s)
        try:
            async with self._get_session().request(
                method, full_url, json=body, timeout=timeout
            ) as resp:
                text = await resp.text()
        except TimeoutError as exc:
            raise RequestError(f"{method} {full_url} timed out after {timeout.total} s") from exc
        except aiohttp.ClientError as exc:
            raise RequestError(f"{method} {full_url} failed: {exc!r}") from exc
        if resp.status >= 500:
            raise RequestError(f"{method} {full_url} -> HTTP {resp.status}: {text[:500]}")
        if resp.status >= 400:
            raise BadRequestError(f"{method} {full_url} -> HTTP {resp.status}: {text[:500]}")
        try:
            return json.loads(text) if text else None
        except json.JSONDecodeError:
            return text  # a few control endpoints (SGLang's /flush_cache) answer in plain text

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
