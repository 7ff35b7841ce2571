"""One thread owns vLLM's LLMEngine and every model computation: submitted tasks run between engine steps."""
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

from workers.vllm.handoff import drop_kv

T = TypeVar("T")
_END = object()
_STOP = object()

_log = logging.getLogger(__name__)


class TokenStream:
    """One vLLM request's token ids as steps produce them; first-token logprobs once known."""

    def __init__(self, request_id: str, held_kv: str | None = None) -> None:
        self.request_id = request_id
        self.held_kv = held_kv  # the handoff key of the context KV lent to vLLM for this request, if any
        self.first_logprobs: dict[int, float] = {}
        self.num_cached_tokens = 0
        self.kv_transfer_params: dict[str, Any] | None = None
        self.finished = False
        self._items: queue.Queue[Any] = queue.Queue()
        self._seen_output = False

    def push(self, output: Any) -> None:
        """Take one RequestOutput (delta kind) of this request."""
        completion = output.outputs[0]
        if not self._seen_output and completion.logprobs:
            self.first_logprobs = {int(t): float(lp.logprob) for t, lp in completion.logprobs[0].items()}
        self._seen_output = self._seen_output or bool(completion.token_ids)
        self.num_cached_tokens = output.num_cached_tokens or 0
        if completion.token_ids:
            self._items.put(list(completion.token_ids))
        if output.finished:
            self.kv_transfer_params = output.kv_transfer_params
            self.finished = True
            self._items.put(_END)

    def fail(self, error: BaseException) -> None:
        """End the stream with an error its reader raises."""
        self.finished = True
        self._items.put(error)

    def __iter__(self) -> Iterator[int]:
        while (item := self._items.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield from item


class EngineLoop:
    """Builds the engine on its own thread, then alternates: one queued task, one engine step (if any work)."""

    def __init__(self, build: Callable[[], Any], name: str = "blendserve-vllm") -> None:
        self._tasks: queue.Queue[Any] = queue.Queue()
        self._streams: dict[str, TokenStream] = {}
        self.peak_running = 0  # most requests vLLM held at once since the last reset
        ready: Future[Any] = Future()
        self._thread = threading.Thread(target=self._run, args=(build, ready), name=name, daemon=True)
        self._thread.start()
        self.engine = ready.result()  # re-raises a failed build here

    def submit(self, fn: Callable[[], T]) -> "Future[T]":
        """Run `fn` on the engine thread between steps; its result or error arrives on the future."""
        future: Future[T] = Future()
        self._tasks.put((fn, future))
        return future

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the engine thread and wait for its result."""
        return self.submit(fn).result()

    def add_request(
        self, request_id: str, prompt: dict[str, Any], params: Any, held_kv: str | None = None
    ) -> TokenStream:
        """Hand a request to vLLM (engine thread only); its outputs go to the returned stream.

        `held_kv`: the handoff key of the context KV the request carries, released here if the request fails.
        """
        self.engine.add_request(request_id, prompt, params)  # returns vLLM's internal id; outputs carry ours
        stream = TokenStream(request_id, held_kv)
        self._streams[request_id] = stream
        self.peak_running = max(self.peak_running, len(self._streams))
        return stream

    def abort(self, stream: TokenStream) -> None:
        """Stop a request that is still running (its consumer went away); returns at once."""
        if not stream.finished:
            self.submit(lambda: self._abort(stream))

    def close(self) -> None:
        """Stop the thread; running requests end with an error."""
        self._tasks.put(_STOP)
        self._thread.join(timeout=60)

    @property
    def num_running(self) -> int:
        """Requests vLLM holds now."""
        return len(self._streams)

    def _fail_all(self, error: BaseException) -> None:
        """Abort every running request in vLLM, release the KV lent to it, and end its stream with `error`."""
        streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            try:
                self.engine.abort_request([stream.request_id])
            except Exception:  # an engine that just failed may refuse; the request is dropped from ours anyway
                _log.warning("blendserve: vLLM could not abort request %s", stream.request_id, exc_info=True)
            if stream.held_kv is not None:
                drop_kv(stream.held_kv)
            stream.fail(error)

    def _abort(self, stream: TokenStream) -> None:
        if self._streams.pop(stream.request_id, None) is not None:
            self.engine.abort_request([stream.request_id])
            stream.fail(RuntimeError("request aborted"))

    def _run(self, build: Callable[[], Any], ready: "Future[Any]") -> None:
        try:
            self.engine = build()
        except BaseException as error:  # noqa: BLE001 - handed to the constructor's caller
            ready.set_exception(error)
            return
        ready.set_result(self.engine)
        while True:
            try:
                task = self._tasks.get_nowait() if self._streams else self._tasks.get()
            except queue.Empty:
                task = None
            if task is _STOP:
                break
            if task is not None:
                fn, future = task
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn())
                    except BaseException as error:  # noqa: BLE001 - the submitter re-raises it
                        future.set_exception(error)
            if self._streams:
                self._step()
        self._fail_all(RuntimeError("the vLLM engine stopped"))

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as error:  # every running request fails; later requests are served as usual
            _log.exception("blendserve: vLLM engine step failed; aborting its %d requests", len(self._streams))
            self._fail_all(error)
            return
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:
                continue
            stream.push(output)
            if output.finished:
                del self._streams[output.request_id]
