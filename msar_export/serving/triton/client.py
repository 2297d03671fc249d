"""Clients for the models `msar-export serve` runs.

- `ServingClient(url)`: tritonclient over HTTP (`http://host:port`) or gRPC
  (`grpc://host:port`), binary tensors.  tritonclient lives in .venv-triton.
- `infer_json(...)`: one raw KServe v2 JSON request with the stdlib alone
  (any environment; used to send deliberately malformed requests).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from urllib.parse import urlparse

import numpy as np

from ...errors import BackendUnavailable, InputError, MsarError
from .env import SETUP_HINT


class InferError(MsarError):
    """The server answered a request with an error (the message is the server's)."""


def parse_url(url: str) -> tuple[str, str]:
    """'http://127.0.0.1:8000' -> ('http', '127.0.0.1:8000'); a bare host:port is HTTP."""
    if "://" not in url:
        url = "http://" + url
    u = urlparse(url)
    try:
        port = u.port  # urllib raises ValueError for a port over 65535 (99999)
    except ValueError:
        port = None
    if u.scheme not in ("http", "grpc") or not u.hostname or not port:
        raise InputError(f"--url {url!r}: use http://HOST:PORT or grpc://HOST:PORT (a port in 1..65535)")
    return u.scheme, f"{u.hostname}:{u.port}"


@dataclass
class PreparedRequest:
    """Inputs built once and sent many times (the load test reuses them)."""
    model: str
    inputs: list
    outputs: list


class ServingClient:
    def __init__(self, url: str, timeout_s: float = 120.0, connect_timeout_s: float = 10.0):
        self.scheme, self.address = parse_url(url)
        self.url = f"{self.scheme}://{self.address}"
        self.timeout_s, self.connect_timeout_s = timeout_s, connect_timeout_s
        try:
            if self.scheme == "http":
                import tritonclient.http as tc

                self._client = tc.InferenceServerClient(self.address, connection_timeout=connect_timeout_s,
                                                        network_timeout=timeout_s)
            else:
                import tritonclient.grpc as tc

                self._client = tc.InferenceServerClient(self.address)
        except ImportError:
            raise BackendUnavailable(f"tritonclient is not installed in this environment; {SETUP_HINT} "
                                     "and run the client from .venv-triton") from None
        self._tc = tc
        from tritonclient.utils import InferenceServerException

        self._exc = InferenceServerException

    # -- server state -------------------------------------------------------------
    def ready(self) -> bool:
        try:
            if self.scheme == "grpc":
                return bool(self._client.is_server_ready(client_timeout=self.connect_timeout_s))
            return bool(self._client.is_server_ready())
        except Exception:
            return False

    def model_config(self, model: str) -> dict:
        if self.scheme == "http":
            return self._client.get_model_config(model)
        return self._json(self._client.get_model_config(model, as_json=True))["config"]

    def model_stats(self, model: str) -> dict:
        if self.scheme == "http":
            return self._client.get_inference_statistics(model)
        return self._json(self._client.get_inference_statistics(model, as_json=True))

    @staticmethod
    def _json(x):
        return x if isinstance(x, dict) else json.loads(x)

    def parameters(self, model: str) -> dict[str, str]:
        return {k: v.get("string_value", v.get("stringValue", "")) for k, v in
                self.model_config(model).get("parameters", {}).items()}

    # -- requests -------------------------------------------------------------------
    def _input(self, name: str, array: np.ndarray, dtype: str):
        t = self._tc.InferInput(name, list(array.shape), dtype)
        if self.scheme == "http":
            t.set_data_from_numpy(array, binary_data=True)
        else:
            t.set_data_from_numpy(array)
        return t

    def _output(self, name: str):
        if self.scheme == "http":
            return self._tc.InferRequestedOutput(name, binary_data=True)
        return self._tc.InferRequestedOutput(name)

    def prepare_logits(self, ids) -> PreparedRequest:
        ids = np.ascontiguousarray(np.atleast_2d(np.asarray(ids, dtype=np.int64)))
        return PreparedRequest("logits", [self._input("input_ids", ids, "INT64")], [self._output("logits")])

    def prepare_generate(self, ids, max_new_tokens: int) -> PreparedRequest:
        ids = np.ascontiguousarray(np.atleast_2d(np.asarray(ids, dtype=np.int64)))
        n = np.full((ids.shape[0], 1), max_new_tokens, np.int32)
        return PreparedRequest("generate", [self._input("input_ids", ids, "INT64"),
                                            self._input("max_new_tokens", n, "INT32")], [self._output("tokens")])

    def send(self, req: PreparedRequest) -> np.ndarray:
        try:
            res = self._client.infer(req.model, req.inputs, outputs=req.outputs,
                                     **({"client_timeout": self.timeout_s} if self.scheme == "grpc" else {}))
        except self._exc as e:
            raise InferError(e.message() if callable(getattr(e, "message", None)) else str(e)) from None
        return res.as_numpy(req.outputs[0].name())

    def logits(self, ids) -> np.ndarray:
        """input_ids [batch, seq] (or [seq]) -> logits [batch, seq, vocab]."""
        return self.send(self.prepare_logits(ids))

    def generate(self, ids, max_new_tokens: int = 16) -> np.ndarray:
        """input_ids [batch, seq] -> the greedy continuation [batch, max_new_tokens]."""
        return self.send(self.prepare_generate(ids, max_new_tokens))

    def close(self) -> None:
        try:
            self._client.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def infer_json(http_url: str, model: str, inputs: list[dict], timeout: float = 60.0) -> tuple[int, dict]:
    """POST one KServe v2 JSON request; return (HTTP status, decoded body).

    `inputs` items are {"name", "shape", "datatype", "data"} exactly as sent, so a
    caller can send anything (wrong dtype, wrong rank, ...)."""
    body = json.dumps({"inputs": inputs}).encode()
    req = urllib.request.Request(f"{http_url.rstrip('/')}/v2/models/{model}/infer", data=body,
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw or b"{}")
        except ValueError:
            return e.code, {"error": raw.decode(errors="replace")}


def json_tensor(name: str, array, datatype: str) -> dict:
    a = np.asarray(array)
    return {"name": name, "shape": list(a.shape), "datatype": datatype, "data": a.reshape(-1).tolist()}


__all__ = ["ServingClient", "InferError", "infer_json", "json_tensor", "parse_url"]
