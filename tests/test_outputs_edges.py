"""Edges of the request metrics (outputs.py) that test_api leaves open: a time not reached yet is None, not 0, and
both times run from the arrival; and a request id is a str."""

from minipic_lite.outputs import RequestMetrics


def test_times_are_none_until_their_event_and_run_from_the_arrival():
    metrics = RequestMetrics(arrival_time=10.0)
    assert (metrics.ttft, metrics.total_time) == (None, None)
    metrics.first_token_time, metrics.finish_time = 10.25, 11.5
    assert (metrics.ttft, metrics.total_time) == (0.25, 1.5)


def test_each_time_waits_for_its_own_event_only():
    """Mid-stream (a first token, no finish) the ttft is known and the total time None; a request aborted before its
    first token has a total time and no ttft. A fresh record counts no preemption."""
    streaming = RequestMetrics(arrival_time=10.0, first_token_time=10.25)
    assert (streaming.ttft, streaming.total_time, streaming.num_preemptions) == (0.25, None, 0)
    aborted = RequestMetrics(arrival_time=10.0, finish_time=10.5)
    assert (aborted.ttft, aborted.total_time) == (None, 0.5)


def test_a_request_id_is_annotated_as_the_str_every_output_carries():
    """The engine's ids are strings ('0', '1', ... or the caller's); the field said int."""
    import typing

    from minipic_lite.outputs import RequestOutput

    assert typing.get_type_hints(RequestOutput)["request_id"] is str


def test_an_output_built_with_the_required_fields_only_has_no_stop_reason_nor_reports():
    """vLLM's defaults for what only some outputs carry: no stop string or token, an empty cache report (not yet
    admitted), no state report (not a hybrid)."""
    from minipic_lite.outputs import RequestOutput

    out = RequestOutput("0", None, [1, 2], "", [], 0, False, None, RequestMetrics(arrival_time=0.0))
    assert (out.stop_reason, out.cache_report, out.state_report) == (None, [], None)


def test_an_output_built_without_completions_lists_one_that_carries_every_flattened_field():
    """`outputs` left empty: its one completion is index 0 with the flattened text, tokens, logprobs, cumulative
    logprob, finish and stop reasons."""
    from minipic_lite.outputs import CompletionOutput, Logprob, RequestOutput

    logprobs = [{5: Logprob(-0.5, 1, "a")}, {6: Logprob(-1.0, 2, "b"), 7: Logprob(-0.25, 1, "c")}]
    metrics = RequestMetrics(arrival_time=0.0)
    out = RequestOutput(
        "0", None, [1], "ab", [5, 6], 0, True, "stop", metrics, stop_reason="b", logprobs=logprobs,
        cumulative_logprob=-1.5,
    )  # fmt: skip
    assert out.outputs == [CompletionOutput(0, "ab", [5, 6], -1.5, logprobs, "stop", "b")]
    assert out.outputs[0].logprobs is out.logprobs and out.outputs[0].finished()
