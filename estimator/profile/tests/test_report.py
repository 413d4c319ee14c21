"""carma_profile.report: the traced reservation as estimator/src/traced.rs computes it, and the fit
that chose its constants (docs/traced-estimate.md)."""

from pathlib import Path

from carma_profile import report

REPO = Path(__file__).resolve().parents[3]


def test_reservation_matches_traced_rs():
    c = report.constants(REPO)
    # estimator/src/traced.rs's doc test: BERT-base's trace, one GPU
    assert report.reservation(c, "transformer", 1, 19_821, 1_908) == c["CONTEXT_MIB"] + 19_821
    # each GPU beyond the first adds the multi-GPU term, whatever the peak
    for peak in (200, 20_000):
        assert report.reservation(c, "transformer", 2, peak, 10) == c["CONTEXT_MIB"] + peak + c["MULTI_GPU_MIB"]
        assert report.reservation(c, "transformer", 3, peak, 10) == (
            c["CONTEXT_MIB"] + peak + 2 * c["MULTI_GPU_MIB"])

def test_replayed_segments_use_the_allocator_constants():
    c = report.constants(REPO)
    # estimator/src/traced.rs's doc test: the same trace with replayed segments
    transformer = c["ALLOCATOR_TRANSFORMER_LARGEST_FACTOR_MILLI"]
    assert report.reservation(c, "transformer", 1, 19_821, 1_908, 20_900) == (
        c["ALLOCATOR_CONTEXT_MIB"] + 20_900 + -(-1_908 * transformer // 1000))
    factor = c["ALLOCATOR_CNN_LARGEST_FACTOR_MILLI"]
    assert report.reservation(c, "cnn", 2, 10_000, 1_000, 12_000) == (
        c["ALLOCATOR_CONTEXT_MIB"] + 12_000 + -(-1_000 * factor // 1000) + c["ALLOCATOR_MULTI_GPU_MIB"])
    assert report.reservation(c, "cnn", 1, 10, 1, 20) == c["FLOOR_MIB"]


def test_fit_covers_every_job_with_the_least_constants():
    rows = [
        {"family": "cnn", "gpus": 1, "measured": 5_000, "reserved": 3_500, "peak": 3_000, "largest": 200},
        {"family": "cnn", "gpus": 1, "measured": 9_000, "reserved": 7_000, "peak": 6_000, "largest": 400},
        {"family": "transformer", "gpus": 1, "measured": 10_000, "reserved": 9_000, "peak": 8_500, "largest": 300},
        {"family": "transformer", "gpus": 2, "measured": 12_000, "reserved": 6_500, "peak": 6_000, "largest": 100},
        {"family": "transformer", "gpus": 2, "measured": 30_000, "reserved": 24_500, "peak": 24_000, "largest": 100},
    ]
    c = report.fit(rows, 1_000, 700)
    over = [report.reserve(c, r) - r["measured"] for r in rows]
    assert min(over) >= 0, (c, over)
    # the CNN factor is set by the job that needs most per MiB of largest tensor: (5000-700-3500)/200 = 4.0
    assert c["ALLOCATOR_CNN_LARGEST_FACTOR_MILLI"] == 4_000
    # the Transformer factor by its single-GPU job: (10000-700-9000)/300 = 1.0
    assert c["ALLOCATOR_TRANSFORMER_LARGEST_FACTOR_MILLI"] == 1_000
    # the multi-GPU term is the larger of the two 2-GPU jobs' needs beyond context, segments and factor
    assert c["ALLOCATOR_MULTI_GPU_MIB"] == max(12_000 - 700 - 6_500 - 100, 30_000 - 700 - 24_500 - 100)
    # a planted underestimate: a fit that ignored the 2-GPU jobs would miss them
    assert report.reserve({**c, "ALLOCATOR_MULTI_GPU_MIB": 0}, rows[4]) < rows[4]["measured"]
