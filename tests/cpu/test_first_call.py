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


def test_the_judgement_s_modules_are_imported_on_the_thread_and_wait_joins_it(monkeypatch):
    import sys
    import threading
    import types

    seen = []
    monkeypatch.setattr(first_call, "_started", None)
    monkeypatch.setattr("kernels_ref._common.interpreting", lambda: False)
    monkeypatch.setattr("triton.runtime.cache.triton_key", lambda: "k")
    gate = threading.Event()

    class Finder:  # a module that only this finder can load, recording the thread that imports it
        def find_spec(self, name, path=None, target=None):
            if name not in ("first_call_probe_module", "first_call_broken_module"):
                return None
            import importlib.util

            return importlib.util.spec_from_loader(name, self)

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            gate.wait(30)
            if module.__name__ == "first_call_broken_module":
                raise ImportError("broken on purpose")
            seen.append(threading.current_thread().name)

    finder = Finder()
    sys.meta_path.insert(0, finder)
    try:
        t = first_call.start(imports=("first_call_broken_module", "first_call_probe_module"))
        assert t.is_alive()  # held at the gate: wait() must join, not return early
        threading.Timer(0.2, gate.set).start()
        first_call.wait()
        assert not t.is_alive()
        assert seen == ["oracle-first-call"]  # a broken module is skipped, the next still imported
        assert isinstance(sys.modules["first_call_probe_module"], types.ModuleType)
    finally:
        sys.meta_path.remove(finder)
        sys.modules.pop("first_call_probe_module", None)


def test_wait_without_a_thread_returns_at_once(monkeypatch):
    monkeypatch.setattr(first_call, "_started", None)
    first_call.wait()
