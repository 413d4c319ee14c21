//! CARMA's risk reduction of GPU activity samples.
//!
//! Each activity metric (SM activity, SM occupancy, DRAM activity) is kept as a
//! window of the last `W` one-second samples and reduced to
//! `0.2·mean + 0.3·median + 0.3·p95 + 0.2·EMA`, with the EMA's smoothing factor
//! `α = 2 / (W + 1)` run over the window from oldest to newest.

use std::collections::VecDeque;

/// Default window length (CARMA: 30 one-second samples).
pub const DEFAULT_WINDOW: usize = 30;

/// Reduce a window of samples (oldest first) to CARMA's risk score.
///
/// Returns `None` for an empty window. Non-finite samples are ignored.
pub fn risk_score(samples: &[f64]) -> Option<f64> {
    let clean: Vec<f64> = samples.iter().copied().filter(|v| v.is_finite()).collect();
    if clean.is_empty() {
        return None;
    }
    let n = clean.len();
    let mean = clean.iter().sum::<f64>() / n as f64;
    let mut sorted = clean.clone();
    sorted.sort_by(f64::total_cmp);
    let median = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    let p95 = percentile_linear(&sorted, 0.95);
    let alpha = 2.0 / (n as f64 + 1.0);
    let ema = clean[1..]
        .iter()
        .fold(clean[0], |acc, v| alpha * v + (1.0 - alpha) * acc);
    Some(0.2 * mean + 0.3 * median + 0.3 * p95 + 0.2 * ema)
}

/// Percentile with linear interpolation between closest ranks (numpy's default).
fn percentile_linear(sorted: &[f64], q: f64) -> f64 {
    let rank = q * (sorted.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    let frac = rank - lo as f64;
    sorted[lo] + (sorted[hi] - sorted[lo]) * frac
}

/// A bounded window of samples of one metric.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleWindow {
    capacity: usize,
    samples: VecDeque<f64>,
    filled_once: bool,
}

impl SampleWindow {
    /// An empty window holding at most `capacity` samples (at least one).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            capacity,
            samples: VecDeque::with_capacity(capacity),
            filled_once: false,
        }
    }

    /// Add a sample, dropping the oldest when full.
    pub fn push(&mut self, value: f64) {
        if self.samples.len() == self.capacity {
            self.samples.pop_front();
        }
        self.samples.push_back(value);
        if self.samples.len() == self.capacity {
            self.filled_once = true;
        }
    }

    /// Number of samples held.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether no sample is held.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The most recent sample.
    pub fn last(&self) -> Option<f64> {
        self.samples.back().copied()
    }

    /// Risk score of the window, or `None` until it has filled once (CARMA makes no decision
    /// before).
    pub fn risk(&self) -> Option<f64> {
        if !self.filled_once {
            return None;
        }
        let (a, b) = self.samples.as_slices();
        if b.is_empty() {
            risk_score(a)
        } else {
            let joined: Vec<f64> = a.iter().chain(b).copied().collect();
            risk_score(&joined)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_window_scores_its_value() {
        let s = risk_score(&[0.5; 30]).unwrap();
        assert!((s - 0.5).abs() < 1e-12);
    }

    #[test]
    fn empty_window_has_no_score() {
        assert_eq!(risk_score(&[]), None);
        assert_eq!(risk_score(&[f64::NAN]), None);
    }

    #[test]
    fn hand_computed_score() {
        // samples 0,0.1,...,0.9 (n = 10): mean 0.45, median 0.45, p95 = 0.855,
        // EMA with alpha 2/11 computed step by step.
        let samples: Vec<f64> = (0..10).map(|i| i as f64 / 10.0).collect();
        let alpha = 2.0 / 11.0;
        let mut ema = 0.0;
        for v in &samples[1..] {
            ema = alpha * v + (1.0 - alpha) * ema;
        }
        let expected = 0.2 * 0.45 + 0.3 * 0.45 + 0.3 * 0.855 + 0.2 * ema;
        let got = risk_score(&samples).unwrap();
        assert!((got - expected).abs() < 1e-12, "{got} vs {expected}");
    }

    #[test]
    fn a_burst_raises_the_score_above_the_mean() {
        let mut samples = vec![0.1; 27];
        samples.extend([0.95, 0.95, 0.95]);
        let mean = samples.iter().sum::<f64>() / 30.0;
        assert!(risk_score(&samples).unwrap() > mean);
    }

    #[test]
    fn window_is_cold_until_filled_once() {
        let mut w = SampleWindow::new(3);
        w.push(0.2);
        w.push(0.2);
        assert_eq!(w.risk(), None);
        w.push(0.2);
        assert!((w.risk().unwrap() - 0.2).abs() < 1e-12);
        w.push(0.8);
        assert_eq!(w.len(), 3);
        assert_eq!(w.last(), Some(0.8));
        assert!(w.risk().unwrap() > 0.2);
    }
}
