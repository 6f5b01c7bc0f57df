"""kernels_ref.first_call: the once-per-process costs paid on a background thread."""

from __future__ import annotations

import kernels_ref.first_call as first_call


def test_nothing_is_started_under_the_interpreter(monkeypatch):
    monkeypatch.setattr(first_call, "_started", None)
    monkeypatch.setattr("kernels_ref._common.interpreting", lambda: True)
    assert first_call.start() is None
    assert first_call._started is None


def test_compiling_process_pays_triton_s_key_once_on_one_thread(monkeypatch):
    calls = []
    monkeypatch.setattr(first_call, "_started", None)
    monkeypatch.setattr("kernels_ref._common.interpreting", lambda: False)
    monkeypatch.setattr("triton.runtime.cache.triton_key", lambda: calls.append("key") or "k")
    t = first_call.start()
    assert t is not None and t.daemon
    assert first_call.start() is t  # once per process
    t.join(30)
    assert not t.is_alive()
    assert calls == ["key"]


def test_a_failing_item_is_left_to_the_judgement(monkeypatch):
    def boom():
        raise RuntimeError("no key here")

    monkeypatch.setattr(first_call, "_started", None)
    monkeypatch.setattr("kernels_ref._common.interpreting", lambda: False)
    monkeypatch.setattr("triton.runtime.cache.triton_key", boom)
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.init", lambda: (_ for _ in ()).throw(RuntimeError("no GPU")))
    t = first_call.start()
    t.join(30)
    assert not t.is_alive()  # ended without raising out of the thread
