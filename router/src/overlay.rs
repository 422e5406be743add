//! This replica's feedback not yet in the aggregates, so that the non-contextual policies
//! (greedy, epsilon-greedy, Thompson, UCB) count a `POST /v1/feedback` at once, as the
//! contextual model does.
//!
//! An outcome enters when its feedback is durable, keyed by (tenant, context key,
//! candidate), and is added to the aggregates' arms of its context at decision time. It
//! leaves at the refresh that reads its feedback identity back from ClickHouse (the
//! contextual model's base then holds it; the aggregates, read just before, do too, or at
//! the next refresh), or after twelve refreshes (at least a minute): feedback that joins no
//! stored decision reaches the aggregates but never the model's base, so it cannot wait for
//! that (held for the window, it counted twice for days, and a tenant's full overlay took
//! no new outcome). Otherwise it is never counted twice:
//! the overlay is trimmed before the new aggregates are installed, so a decision sees
//! either the old aggregates with the overlay or the new ones without what they hold (an
//! outcome stored between the two reads of one refresh counts from the next one).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::model::{ArmStats, Arms};

/// Outcomes held at most per tenant; beyond, a feedback counts from the next refresh.
pub const OVERLAY_MAX: usize = 10_000;

struct Entry {
    feedback_id: String,
    candidate_id: String,
    delta: ArmStats,
    at: Instant,
}

/// The outcomes held in one context, and their sum per candidate (what a decision adds:
/// its cost does not grow with the outcomes held). The sum is shared: a decision takes it
/// under the lock as an `Arc` and reads it out of the lock; an outcome added while a
/// decision still reads it copies it first.
#[derive(Default)]
struct Held {
    entries: Vec<Entry>,
    sum: Arc<Arms>,
}

impl Held {
    fn resum(&mut self) {
        let mut sum = Arms::new();
        for e in &self.entries {
            add(sum.entry(e.candidate_id.clone()).or_default(), &e.delta);
        }
        self.sum = Arc::new(sum);
    }
}

#[derive(Default)]
struct TenantOverlay {
    by_context: HashMap<String, Held>,
    ids: HashSet<String>,
}

/// The pending outcomes of every tenant.
#[derive(Default)]
pub struct Overlay {
    tenants: Mutex<HashMap<String, TenantOverlay>>,
}

/// One outcome as an aggregate cell's increment.
pub struct Delta<'a> {
    /// Its feedback identity.
    pub feedback_id: &'a str,
    /// The context key it is filed under (the decision's).
    pub context_key: &'a str,
    /// The candidate that ran.
    pub candidate_id: &'a str,
    /// Success reported.
    pub success: bool,
    /// Latency reported (ms).
    pub latency_ms: Option<f64>,
    /// Cost (`cost.usd`, else `cost.amount`, else 0).
    pub cost: f64,
    /// Quality score reported.
    pub quality: Option<f64>,
}

fn add(a: &mut ArmStats, d: &ArmStats) {
    a.n += d.n;
    a.successes += d.successes;
    a.latency_n += d.latency_n;
    a.latency_sum += d.latency_sum;
    a.cost_sum += d.cost_sum;
    a.quality_n += d.quality_n;
    a.quality_sum += d.quality_sum;
}

impl Overlay {
    /// Hold one outcome of `tenant` (once per feedback identity); `false` when it was held
    /// already or the tenant's overlay is full.
    pub fn add(&self, tenant: &str, d: &Delta) -> bool {
        let mut all = self.tenants.lock();
        let t = all.entry(tenant.to_owned()).or_default();
        if t.ids.len() >= OVERLAY_MAX || !t.ids.insert(d.feedback_id.to_owned()) {
            return false;
        }
        let delta = ArmStats {
            n: 1.0,
            successes: f64::from(u8::from(d.success)),
            latency_n: f64::from(u8::from(d.latency_ms.is_some())),
            latency_sum: d.latency_ms.unwrap_or(0.0),
            latency_q: None,
            cost_sum: d.cost,
            quality_n: f64::from(u8::from(d.quality.is_some())),
            quality_sum: d.quality.unwrap_or(0.0),
        };
        let held = t.by_context.entry(d.context_key.to_owned()).or_default();
        add(
            Arc::make_mut(&mut held.sum)
                .entry(d.candidate_id.to_owned())
                .or_default(),
            &delta,
        );
        held.entries.push(Entry {
            feedback_id: d.feedback_id.to_owned(),
            candidate_id: d.candidate_id.to_owned(),
            delta,
            at: Instant::now(),
        });
        true
    }

    /// The arms of the `candidates` (a decision's) in (tenant, context): `base`'s (the
    /// aggregates') with the held outcomes added; `None` when none is held in that context
    /// (use `base` as it is). Under the lock, which every tenant's feedback and
    /// non-contextual decisions take, only the context's held sums are taken (an `Arc`);
    /// the arms are built out of it, of the candidates named only: the work does not grow
    /// with the candidates the context has in the aggregates (up to `--max-cells`; before,
    /// all of them were cloned under the lock at every decision).
    pub fn arms<'a>(
        &self,
        tenant: &str,
        context_key: &str,
        base: Option<&Arms>,
        candidates: impl IntoIterator<Item = &'a str>,
    ) -> Option<Arms> {
        let held = {
            let all = self.tenants.lock();
            all.get(tenant)?.by_context.get(context_key)?.sum.clone()
        };
        let mut arms = Arms::new();
        for candidate in candidates {
            let (b, d) = (base.and_then(|b| b.get(candidate)), held.get(candidate));
            if b.is_none() && d.is_none() {
                continue;
            }
            let mut a = b.cloned().unwrap_or_default();
            if let Some(d) = d {
                add(&mut a, d);
            }
            arms.insert(candidate.to_owned(), a);
        }
        Some(arms)
    }

    /// Drop the outcomes ClickHouse now holds (`stored(tenant, feedback_id)`) and those
    /// older than `max_age`. `stored` is asked outside the overlay's lock: it takes the
    /// tenants' model locks, and every decision of every tenant waits on this one. An
    /// outcome added meanwhile is asked at the next refresh.
    pub fn trim(&self, stored: impl Fn(&str, &str) -> bool, max_age: Duration) {
        let held: Vec<(String, Vec<String>)> = self
            .tenants
            .lock()
            .iter()
            .map(|(tenant, t)| (tenant.clone(), t.ids.iter().cloned().collect()))
            .collect();
        let in_store: HashMap<String, HashSet<String>> = held
            .into_iter()
            .map(|(tenant, ids)| {
                let ids: HashSet<String> =
                    ids.into_iter().filter(|id| stored(&tenant, id)).collect();
                (tenant, ids)
            })
            .filter(|(_, ids)| !ids.is_empty())
            .collect();
        let none = HashSet::new();
        let mut all = self.tenants.lock();
        for (tenant, t) in all.iter_mut() {
            let (ids, in_store) = (&mut t.ids, in_store.get(tenant).unwrap_or(&none));
            for held in t.by_context.values_mut() {
                let before = held.entries.len();
                held.entries.retain(|e| {
                    let keep = e.at.elapsed() < max_age && !in_store.contains(&e.feedback_id);
                    if !keep {
                        ids.remove(&e.feedback_id);
                    }
                    keep
                });
                if held.entries.len() != before {
                    held.resum();
                }
            }
            t.by_context.retain(|_, held| !held.entries.is_empty());
        }
        all.retain(|_, t| !t.ids.is_empty());
    }

    /// Outcomes held for `tenant`.
    pub fn len(&self, tenant: &str) -> usize {
        self.tenants.lock().get(tenant).map_or(0, |t| t.ids.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta<'a>(id: &'a str, ctx: &'a str, cand: &'a str, success: bool) -> Delta<'a> {
        Delta {
            feedback_id: id,
            context_key: ctx,
            candidate_id: cand,
            success,
            latency_ms: Some(100.0),
            cost: 0.5,
            quality: None,
        }
    }

    #[test]
    fn held_outcomes_count_once_until_stored() {
        let o = Overlay::default();
        assert!(o.add("t", &delta("f1", "c", "a", true)));
        assert!(
            !o.add("t", &delta("f1", "c", "a", true)),
            "once per identity"
        );
        assert!(o.add("t", &delta("f2", "c", "b", false)));
        assert!(o.add("u", &delta("f3", "c", "a", true)));
        let mut base = Arms::new();
        base.insert(
            "a".into(),
            ArmStats {
                n: 2.0,
                successes: 1.0,
                ..ArmStats::default()
            },
        );
        let arms = o.arms("t", "c", Some(&base), ["a", "b"]).unwrap();
        assert_eq!((arms["a"].n, arms["a"].successes), (3.0, 2.0));
        assert_eq!((arms["b"].n, arms["b"].successes), (1.0, 0.0));
        assert_eq!(arms["a"].latency_n, 1.0);
        assert!((arms["b"].cost_sum - 0.5).abs() < 1e-12);
        assert!(o.arms("t", "other", Some(&base), ["a", "b"]).is_none());
        // f1 is stored now: it leaves; f2 stays; u's is untouched.
        // Asked without the overlay's lock held: a decision goes on meanwhile.
        o.trim(
            |t, id| {
                assert!(
                    o.tenants.try_lock().is_some(),
                    "asked under the overlay's lock"
                );
                t == "t" && id == "f1"
            },
            Duration::from_secs(60),
        );
        let arms = o.arms("t", "c", Some(&base), ["a", "b"]).unwrap();
        assert_eq!(arms["a"].n, 2.0);
        assert_eq!(o.len("t"), 1);
        assert_eq!(o.len("u"), 1);
        // Older than the window: gone.
        o.trim(|_, _| false, Duration::ZERO);
        assert_eq!((o.len("t"), o.len("u")), (0, 0));
        assert!(o.arms("t", "c", None, ["a"]).is_none());
    }

    /// A decision's arms are its candidates' (the aggregates' figures with the held
    /// outcomes added, as for the whole context), however many candidates the context has
    /// in the aggregates: what is built, and copied under the overlay's lock, is bounded by
    /// the request (before, the context's every arm was cloned under it).
    #[test]
    fn a_decision_gets_its_candidates_arms_only() {
        let o = Overlay::default();
        assert!(o.add("t", &delta("f1", "c", "c7", true)));
        assert!(o.add("t", &delta("f2", "c", "new", false)));
        let base: Arms = (0..10_000)
            .map(|i| {
                let a = ArmStats {
                    n: f64::from(i),
                    successes: f64::from(i / 2),
                    ..ArmStats::default()
                };
                (format!("c{i}"), a)
            })
            .collect();
        let arms = o
            .arms("t", "c", Some(&base), ["c7", "c9", "new", "unknown"])
            .unwrap();
        assert_eq!(arms.len(), 3, "the candidates named that have figures");
        assert_eq!(
            arms.keys().map(String::as_str).collect::<Vec<_>>(),
            ["c7", "c9", "new"],
            "the candidates named that have figures, nothing else"
        );
        assert_eq!((arms["c7"].n, arms["c7"].successes), (8.0, 4.0));
        assert_eq!((arms["c9"].n, arms["c9"].successes), (9.0, 4.0));
        assert_eq!((arms["new"].n, arms["new"].successes), (1.0, 0.0));
        assert!((arms["new"].cost_sum - 0.5).abs() < 1e-12);
    }
}
