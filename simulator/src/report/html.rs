//! `--out DIR`: a self-contained HTML report.
