"""Edges of the request metrics (outputs.py) that test_api leaves open: a time not reached yet is None, not 0, and
both times run from the arrival."""

from minipic_lite.outputs import RequestMetrics


def test_times_are_none_until_their_event_and_run_from_the_arrival():
    metrics = RequestMetrics(arrival_time=10.0)
    assert (metrics.ttft, metrics.total_time) == (None, None)
    metrics.first_token_time, metrics.finish_time = 10.25, 11.5
    assert (metrics.ttft, metrics.total_time) == (0.25, 1.5)
