//! Ranges of a model profile's numbers, below everything that reads them: the profile, its
//! layer-by-layer reading and the parsers.
//!
//! They are generous for any job that one cluster trains and keep every product the features
//! and the analytic bound form far from overflow; the combined size is bounded by
//! [`MAX_ESTIMATE_MIB`]. `optimizer` and `mixedPrecision` are closed sets (serde rejects other
//! values).

/// Largest `batchSize`: 2^20, 32 × DLRM's 32,768 (the largest in CARMA's traces).
pub const MAX_BATCH_SIZE: u32 = 1 << 20;
/// Largest `parameters`: 10^12, beyond the largest published dense models.
pub const MAX_PARAMETERS: u64 = 1_000_000_000_000;
/// Largest `activations` per sample: 10^12 (GPT-2 large has under 10^9).
pub const MAX_ACTIVATIONS: u64 = 1_000_000_000_000;
/// Largest `depth` and layer count of one type: 100,000 (the deepest published
/// networks have a few thousand layers).
pub const MAX_LAYERS: u32 = 100_000;
/// Largest `seqLength`: 2^20 tokens, the longest context windows offered.
pub const MAX_SEQ_LENGTH: u32 = 1 << 20;
/// Largest analytic upper bound a profile may come to: 2^30 MiB (1 PiB), some
/// thousand times a whole 8-GPU server; in-range fields whose product is
/// larger describe no job a GPU cluster could run.
pub const MAX_ESTIMATE_MIB: u64 = 1 << 30;
