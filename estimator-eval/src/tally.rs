//! What the evaluation counts of one reservation source: rows, underestimates, and the
//! over-reservation's mean and 95th percentile.

use serde::Serialize;

/// Underestimates and over-reservation of one estimator.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Tally {
    /// Rows counted.
    pub rows: usize,
    /// Rows whose reservation is below the measured peak (an OOM crash).
    pub underestimates: usize,
    /// Mean of `max(0, reservation − peak)` (MiB).
    pub mean_over_reservation_mib: f64,
    /// 95th percentile (nearest rank) of `max(0, reservation − peak)` (MiB).
    pub p95_over_reservation_mib: u64,
}

impl Tally {
    /// The tally of (reservation, peak) pairs.
    pub fn of(pairs: impl Iterator<Item = (u64, u64)>) -> Tally {
        let (mut under, mut overs) = (0usize, Vec::new());
        for (reservation, peak) in pairs {
            if reservation < peak {
                under += 1;
            }
            overs.push(reservation.saturating_sub(peak));
        }
        overs.sort_unstable();
        let rows = overs.len();
        let p95 = match rows {
            0 => 0,
            n => overs[(n * 95).div_ceil(100).max(1) - 1],
        };
        Tally {
            rows,
            underestimates: under,
            mean_over_reservation_mib: if rows == 0 {
                0.0
            } else {
                overs.iter().sum::<u64>() as f64 / rows as f64
            },
            p95_over_reservation_mib: p95,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tally() {
        let t = Tally::of([(100, 50), (40, 50), (60, 60)].into_iter());
        assert_eq!((t.rows, t.underestimates), (3, 1));
        assert!((t.mean_over_reservation_mib - 50.0 / 3.0).abs() < 1e-9);
        assert_eq!(t.p95_over_reservation_mib, 50);
        let t = Tally::of((0..20).map(|i| (100 + i, 100)));
        // nearest rank: the 19th of 20 sorted over-reservations (0..=19)
        assert_eq!(t.p95_over_reservation_mib, 18);
    }
}
