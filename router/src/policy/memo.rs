//! Memoised posterior counts: the Monte-Carlo work of a decision, done once per posterior
//! state.

use super::{thompson_counts, Estimate, PolicyConfig};
use crate::rng::Rng;

/// Posterior key -> counts.
type MemoMap = std::collections::HashMap<Vec<u64>, std::sync::Arc<[f64]>>;

/// Memoised posterior counts, keyed by everything a Thompson draw depends on: each
/// admissible estimate's Beta parameters and the rest of its utility, in order (the policy
/// weights are fixed per memo). Between two snapshot refreshes every request of one
/// context with the same candidates has the same posterior, so the Monte-Carlo work (the
/// bulk of a decision's CPU) is done once per posterior state instead of once per request,
/// with more draws (`samples`) than a single decision could afford. The key holds the
/// numbers themselves, not a tenant or context name, so no state is shared that could not
/// be recomputed from the caller's own estimates. Bounded: cleared when `capacity` keys are
/// held.
#[derive(Debug)]
pub struct PosteriorMemo {
    map: std::sync::Mutex<MemoMap>,
    samples: usize,
    capacity: usize,
    hits: std::sync::atomic::AtomicU64,
    misses: std::sync::atomic::AtomicU64,
}

impl PosteriorMemo {
    /// A memo drawing `samples` posterior draws per new key, holding at most `capacity` keys.
    pub fn new(samples: usize, capacity: usize) -> Self {
        PosteriorMemo {
            map: Default::default(),
            samples: samples.max(1),
            capacity: capacity.max(1),
            hits: Default::default(),
            misses: Default::default(),
        }
    }

    /// Draws per key.
    pub fn samples(&self) -> usize {
        self.samples
    }

    fn key(cfg: &PolicyConfig, ests: &[Estimate]) -> Vec<u64> {
        let mut key = Vec::with_capacity(ests.len() * 3);
        for e in ests {
            let (a, b) = e.alpha_beta(cfg);
            key.extend([a.to_bits(), b.to_bits(), e.utility_at(cfg, 0.0).to_bits()]);
        }
        key
    }

    /// The posterior counts of `ests` (computed with `rng` on a miss).
    pub fn counts(
        &self,
        cfg: &PolicyConfig,
        ests: &[Estimate],
        rng: &mut Rng,
    ) -> std::sync::Arc<[f64]> {
        use std::sync::atomic::Ordering::Relaxed;
        let key = Self::key(cfg, ests);
        if let Some(c) = self.lock().get(&key) {
            self.hits.fetch_add(1, Relaxed);
            return c.clone();
        }
        self.misses.fetch_add(1, Relaxed);
        // Drawn outside the lock: a concurrent miss on the same key draws twice, harmlessly.
        let counts: std::sync::Arc<[f64]> = thompson_counts(cfg, ests, rng, self.samples).into();
        let mut map = self.lock();
        if map.len() >= self.capacity {
            map.clear();
        }
        map.insert(key, counts.clone());
        counts
    }

    /// (hits, misses) so far.
    pub fn stats(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.hits.load(Relaxed), self.misses.load(Relaxed))
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, MemoMap> {
        // A panic while holding the map cannot leave it inconsistent (one insert or clear).
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }
}
