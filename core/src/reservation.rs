//! Where a pod's or task's first reservation comes from, in carma's order: the memory override,
//! else the estimate — or what earlier runs of the same model profile used in its place
//! ([`crate::learned_reservation`]) — else the whole GPU. The extender, the simulator and
//! `carma local` reserve by [`first_reservation`].

use crate::history::LearnedReservation;
use crate::model::Reservation;

/// A first reservation and where it comes from. `E` is what the caller keeps of an estimate
/// (its source, its class).
#[derive(Debug, Clone, PartialEq)]
pub enum FirstReservation<E> {
    /// The memory override, MiB per GPU.
    Override(u64),
    /// The estimate, MiB per GPU.
    Estimate {
        /// Per-GPU reservation, MiB.
        mib: u64,
        /// What the caller keeps of the estimate.
        estimate: E,
    },
    /// What earlier runs of the model used, in place of the estimate.
    Learned {
        /// The learned reservation.
        learned: LearnedReservation,
        /// The estimate it replaced.
        estimate: E,
    },
    /// Neither an override nor an estimate: whole GPUs.
    WholeGpu,
}

impl<E> FirstReservation<E> {
    /// The reservation.
    pub fn reservation(&self) -> Reservation {
        match self {
            FirstReservation::Override(mib) | FirstReservation::Estimate { mib, .. } => {
                Reservation::Mib(*mib)
            }
            FirstReservation::Learned { learned, .. } => Reservation::Mib(learned.mib),
            FirstReservation::WholeGpu => Reservation::WholeGpu,
        }
    }
}

/// The first reservation: `override_mib` when there is one; else the estimate (`estimate` is
/// called only then, and gives its MiB and what to keep of it, or `None` when there is none),
/// unless `learned` gives a reservation in its place for that MiB; else the whole GPU. An error
/// of `estimate` is returned as it is.
pub fn first_reservation<E, X>(
    override_mib: Option<u64>,
    estimate: impl FnOnce() -> Result<Option<(u64, E)>, X>,
    learned: impl FnOnce(u64) -> Option<LearnedReservation>,
) -> Result<FirstReservation<E>, X> {
    if let Some(mib) = override_mib {
        return Ok(FirstReservation::Override(mib));
    }
    Ok(match estimate()? {
        Some((mib, estimate)) => match learned(mib) {
            Some(learned) => FirstReservation::Learned { learned, estimate },
            None => FirstReservation::Estimate { mib, estimate },
        },
        None => FirstReservation::WholeGpu,
    })
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use super::*;

    const LEARNED: LearnedReservation = LearnedReservation {
        mib: 6_000,
        samples: 3,
    };

    #[test]
    fn override_then_learned_or_estimate_then_whole_gpu() {
        // The override wins; neither the estimate nor history is asked.
        let first = first_reservation(
            Some(4_096),
            || -> Result<Option<(u64, &str)>, Infallible> { panic!("estimated") },
            |_| panic!("learned"),
        );
        assert_eq!(first, Ok(FirstReservation::Override(4_096)));
        // History in place of the estimate, when it has a figure for it.
        let first = first_reservation(
            None,
            || Ok::<_, Infallible>(Some((8_192, "mlp"))),
            |m| {
                assert_eq!(m, 8_192);
                Some(LEARNED)
            },
        );
        assert_eq!(
            first,
            Ok(FirstReservation::Learned {
                learned: LEARNED,
                estimate: "mlp"
            })
        );
        let Ok(first) =
            first_reservation(None, || Ok::<_, Infallible>(Some((8_192, "mlp"))), |_| None);
        assert_eq!(first.reservation(), Reservation::Mib(8_192));
        // No estimate: whole GPUs, history not asked.
        let Ok(first) = first_reservation(
            None,
            || Ok::<Option<(u64, ())>, Infallible>(None),
            |_| panic!("learned"),
        );
        assert_eq!(first, FirstReservation::WholeGpu);
        assert_eq!(first.reservation(), Reservation::WholeGpu);
        // The estimate's error stands.
        let failed = first_reservation(
            None,
            || Err::<Option<(u64, ())>, _>("bad profile"),
            |_| None,
        );
        assert_eq!(failed, Err("bad profile"));
    }
}
