//! The GPU memory limit a container is given next to its reservation.
//!
//! carma's reservations are bookings: nothing in the GPU stops a process from allocating more.
//! So that an enforcement layer (an MPS limit, a CUDA allocation hook reading the environment)
//! can hold each container to a bound, every container carma places is told its reservation and a
//! limit. The rule, [`memory_limit_mib`]:
//!
//! > **limit = min(reservation, total − the reservations of the others on the GPU)**, where the
//! > others are every other pod or claim on that GPU when the container is placed (admitted by
//! > the kubelet).
//!
//! It never lets the limits of the containers on one GPU add up to more than its memory: of the
//! containers on a GPU at any moment, take the one placed last; everyone else was already there
//! when its limit was set, so its limit is at most the total minus their reservations, and each of
//! their limits is at most their reservation. Counting too many others (a pod bound but not yet
//! started, one that is about to end) only lowers a limit, so callers may err on that side.
//!
//! Where the reservations on a GPU fit in its memory — the DRA path, whose allocator keeps the
//! booked `memory` within the device's capacity, and the device plugin's usual case — the limit is
//! the reservation. It is lower only when the GPU is overcommitted (the device plugin's memory
//! test reads the free memory telemetry reports, which can exceed what the others reserved), and
//! then the latecomer gets what is left: possibly 0.

/// The limit of a container reserving `reservation_mib` on a GPU of `total_mib` where the others
/// reserve `others_reserved_mib` (see the module documentation).
pub fn memory_limit_mib(reservation_mib: u64, total_mib: u64, others_reserved_mib: u64) -> u64 {
    reservation_mib.min(total_mib.saturating_sub(others_reserved_mib))
}

/// One GPU of a container, as [`container_memory_limit_mib`] needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuMemory {
    /// The GPU's memory, MiB.
    pub total_mib: u64,
    /// What the other pods or claims on it reserve, MiB.
    pub others_reserved_mib: u64,
}

/// The limit of a container with the same reservation on each of `gpus` (a container carries one
/// value for all its GPUs): the smallest of its GPUs' [`memory_limit_mib`]; the reservation when
/// `gpus` is empty.
pub fn container_memory_limit_mib(
    reservation_mib: u64,
    gpus: impl IntoIterator<Item = GpuMemory>,
) -> u64 {
    gpus.into_iter()
        .map(|g| memory_limit_mib(reservation_mib, g.total_mib, g.others_reserved_mib))
        .min()
        .unwrap_or(reservation_mib)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_the_reservation_while_the_gpu_is_not_overcommitted() {
        assert_eq!(memory_limit_mib(8192, 40960, 0), 8192);
        assert_eq!(memory_limit_mib(8192, 40960, 32768), 8192);
        assert_eq!(memory_limit_mib(8192, 40960, 36864), 4096);
        assert_eq!(memory_limit_mib(8192, 40960, 50000), 0);
        // A reservation above the GPU (a whole-GPU booking of a larger model) is capped by it.
        assert_eq!(memory_limit_mib(81920, 40960, 0), 40960);
        let gpu = |others| GpuMemory {
            total_mib: 40960,
            others_reserved_mib: others,
        };
        assert_eq!(container_memory_limit_mib(8192, [gpu(0), gpu(36864)]), 4096);
        assert_eq!(container_memory_limit_mib(8192, []), 8192);
    }

    /// Random arrivals and departures on one GPU, each arrival limited by the rule against the
    /// reservations present: the limits present never add up to more than the GPU.
    #[test]
    fn the_limits_on_a_gpu_never_exceed_its_memory() {
        let total = 40960u64;
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        // (reservation, limit) of the containers on the GPU.
        let mut present: Vec<(u64, u64)> = Vec::new();
        for _ in 0..10_000 {
            if !present.is_empty() && next() % 3 == 0 {
                let i = (next() % present.len() as u64) as usize;
                present.swap_remove(i);
                continue;
            }
            let reservation = 1024 + next() % 30_000;
            let others: u64 = present.iter().map(|(r, _)| r).sum();
            let limit = memory_limit_mib(reservation, total, others);
            assert!(limit <= reservation);
            present.push((reservation, limit));
            let limits: u64 = present.iter().map(|(_, l)| l).sum();
            assert!(limits <= total, "{limits} MiB of limits on {total} MiB");
        }
    }
}
