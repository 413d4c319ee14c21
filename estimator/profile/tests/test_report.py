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

def test_fit_covers_every_job_with_the_least_multi_gpu_term():
    rows = [
        {"family": "cnn", "gpus": 1, "measured": 5_000, "peak": 3_000, "largest": 200},
        {"family": "transformer", "gpus": 1, "measured": 10_000, "peak": 9_500, "largest": 300},
        {"family": "transformer", "gpus": 2, "measured": 12_000, "peak": 6_000, "largest": 100},
        {"family": "transformer", "gpus": 2, "measured": 30_000, "peak": 24_000, "largest": 100},
    ]
    c = report.fit(rows, 1_000)
    over = [report.reservation(c, r["family"], r["gpus"], r["peak"], r["largest"]) - r["measured"] for r in rows]
    assert min(over) >= 0, (c, over)
    # the multi-GPU term is the larger of the two jobs' needs beyond context and peak
    assert c["MULTI_GPU_MIB"] == max(12_000 - 6_000, 30_000 - 24_000) - c["CONTEXT_MIB"]
