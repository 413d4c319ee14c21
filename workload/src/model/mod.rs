//! The simulator's physical models, each a small documented function with its
//! parameters exposed as `carma simulate` flags.
//!
//! | model | module | parameters (defaults) | source |
//! |---|---|---|---|
//! | SM activity of a task | [`activity`] | per model class; `--activity-scale 1.0` | assigned per class, anchored on CARMA's collocation observations |
//! | slowdown while sharing | [`slowdown`] | `--slowdown-model saturation` (default): `--slowdown-threshold 0.8`, `--slowdown-exponent 1.0`; `--slowdown-model time-slicing`: `--slicing-full-activity 0.70`, `--slicing-exponent 0.77`, `--slicing-efficiency 0.93` | saturation: CARMA, collocation pays off while summed SM activity ≤ ~0.8; time-slicing: fitted to training jobs time-sliced on an H100 (mean absolute rate error 0.025, against 0.107 for saturation at its defaults; `docs/slowdown-on-h100.md`) |
//! | power and energy | [`power`] | `--idle-power 55`, `--max-power 400` (W) | NVIDIA A100 SXM4 40 GB: 400 W board power; ~50–60 W idle |
//! | telemetry lag | [`telemetry`] | `--telemetry-lag 15s` | CARMA's 30 s warm-up lock exists because memory shows late |
//!
//! True peak memory comes from the workload itself (CARMA's measured peaks);
//! the out-of-memory rule is in the engine: when the summed true peaks of the
//! tasks on a GPU exceed its memory, the task that allocates last crashes.

pub mod activity;
pub mod power;
pub mod slowdown;
pub mod telemetry;

pub use activity::{Activity, ActivityClass};
pub use power::PowerModel;
pub use slowdown::SlowdownModel;
pub use telemetry::TelemetryModel;
