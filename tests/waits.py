"""Every wait of the loop tests under one bound: a loop that stalls fails its test after WAIT_S instead of hanging
the suite. Generous, so that a slow CI machine never trips it; a working loop answers in milliseconds."""

import threading

WAIT_S = 120


def run_with_timeout(fn, *args, **kwargs):
    """fn(*args, **kwargs) in a worker thread: its result, or its error re-raised here; fails if it has not returned
    within WAIT_S (the thread is a daemon: left waiting, it cannot keep the test process alive)."""
    result, error = [], []
    thread = threading.Thread(target=_capture, args=(fn, args, kwargs, result, error), daemon=True)
    thread.start()
    thread.join(WAIT_S)
    assert not thread.is_alive(), f"{getattr(fn, '__name__', fn)} hung for {WAIT_S} s"
    if error:
        raise error[0]
    return result[0]


def _capture(fn, args, kwargs, result, error):
    try:
        result.append(fn(*args, **kwargs))
    except BaseException as e:  # noqa: BLE001
        error.append(e)


def stream_and_abort(llm, prompt, params, request_id: str) -> list:
    """A stream's outputs when `llm.abort(request_id)` ends it after two (its blocks free when the abort returns)."""

    def scenario():
        stream = llm.stream(prompt, params, request_id=request_id)
        outs = [next(stream), next(stream)]
        llm.abort(request_id)
        assert llm.engine.pool.num_free_blocks == llm.engine.pool.num_blocks  # freed when abort returns
        return outs + list(stream)

    return run_with_timeout(scenario)
