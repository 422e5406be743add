//! The contextual model as served: per tenant, a **base** learnt from ClickHouse (decisions
//! joined with their feedback by (tenant, decision_id), in the order they became visible),
//! plus this replica's own feedback not yet seen there (**pending**), learnt at once.
//!
//! At a refresh the rows that became visible since the last one are learnt into the base,
//! skipping every feedback identity the base already holds (so a duplicate row, or a row read
//! twice because the read windows overlap, counts once); pending outcomes that now appear in
//! ClickHouse leave the pending list; the served model becomes the base with the remaining
//! pending outcomes replayed. Each outcome is therefore counted exactly once, and once every
//! outcome is stored, every replica serves the model rebuilt from ClickHouse.
//!
//! The tenant's lock, which every decision and feedback takes, is held only for bookkeeping:
//! the rows are learnt into the base's model, and the served model is copied and replayed,
//! with it released ([`Live::reconcile`], [`Live::serve_anew`]). An outcome learnt at once
//! while a replay is computed is learnt into the model served meanwhile, and into the new
//! one when it is swapped in: once in each, never lost, never twice.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;

use std::collections::BTreeMap;

use serde_json::Value;

use crate::decide::Remembered;
use crate::learner::{LearnerConfig, Observation, Outcome, TenantModel};
use crate::policy::PolicyConfig;
use crate::store::OutcomeRow;

mod rebuild;
#[cfg(test)]
pub(crate) use rebuild::outcome_row;
pub use rebuild::{read_page, rebuild, PageRequest, Rebuild, Slices};

/// Feedback identities remembered per tenant base (older ones are forgotten first).
pub const APPLIED_MAX: usize = 500_000;
/// Pending (not yet stored) outcomes kept per tenant; past it a feedback is not learnt at
/// once and counts from the refresh that reads it stored.
pub const PENDING_MAX: usize = 100_000;
/// A pending outcome the stored rows have not brought back in this long leaves the pending
/// list: its decision was not stored (its publish failed after the answer), so no rebuild
/// will ever learn it, and every refresh replayed it for nothing.
pub const PENDING_MAX_AGE: Duration = Duration::from_secs(600);
/// A decision counts as in flight for this long without its outcome.
pub const INFLIGHT_TIMEOUT: Duration = Duration::from_secs(30);
/// Candidates tracked in flight per tenant. Past it the expired ones go, then the least
/// recently decided: a caller naming new candidates without end cannot grow the map.
pub const INFLIGHT_MAX: usize = 50_000;

#[derive(Default)]
struct Applied {
    set: HashSet<String>,
    order: VecDeque<String>,
}

impl Applied {
    fn insert(&mut self, id: &str) -> bool {
        if self.set.contains(id) {
            return false;
        }
        if self.order.len() >= APPLIED_MAX {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        self.set.insert(id.to_owned());
        self.order.push_back(id.to_owned());
        true
    }
}

/// What one outcome is the outcome of: a decision's candidate (the choice, or a fallback
/// that ran instead).
fn outcome_key(decision_id: &str, candidate_id: &str) -> String {
    format!("{decision_id}\n{candidate_id}")
}

/// One tenant's model learnt from ClickHouse alone, with the identities it holds, the
/// (decision, candidate) pairs it has an outcome of, and the place in the visibility order
/// of the last row it learnt.
#[derive(Default)]
struct Base {
    model: TenantModel,
    applied: Applied,
    answered: Applied,
    last: (i64, String),
}

impl Base {
    /// Learn a stored row unless its identity is already held, or its decision's candidate
    /// already has an outcome (one outcome per candidate of a decision: a feedback posted
    /// again, through another replica or with another timestamp, is another identity of the
    /// same outcome; it is held, not learnt); `true` when it came out of the visibility
    /// order (before the last row learnt). `evicted` counts the arms it made room by.
    fn learn(&mut self, cfg: &LearnerConfig, row: &Stored, evicted: &AtomicU64) -> bool {
        let Some(late) = self.admit(row) else {
            return false;
        };
        if self.model.learn(cfg, &row.obs) {
            evicted.fetch_add(1, Relaxed);
        }
        late
    }

    /// The bookkeeping of [`Base::learn`] without the model: `None` when the row is not to
    /// be learnt (identity held, or its decision's candidate answered), else `Some(late)`.
    fn admit(&mut self, row: &Stored) -> Option<bool> {
        if !self.applied.insert(&row.obs.feedback_id) {
            return None;
        }
        if !self
            .answered
            .insert(&outcome_key(&row.decision_id, &row.obs.candidate_id))
        {
            return None;
        }
        let late = row.key < self.last;
        if !late {
            self.last = row.key.clone();
        }
        Some(late)
    }
}

/// A stored outcome: tenant, place in the visibility order (visible µs, feedback id), and
/// the observation.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The tenant of the decision and its feedback.
    pub tenant: String,
    /// (visibility µs, feedback id): the order rows are learnt in.
    pub key: (i64, String),
    /// The decision the feedback answers.
    pub decision_id: String,
    /// What to learn.
    pub obs: Observation,
}

/// Every tenant's base rebuilt from ClickHouse, off to the side (see [`rebuild`]), to be
/// [`Live::install`]ed.
#[derive(Default)]
pub struct Rebuilt {
    tenants: HashMap<String, Base>,
    /// The highest visibility learnt (µs).
    pub top: Option<i64>,
    /// Arms dropped to stay within [`LearnerConfig::max_arms`] while learning.
    pub evicted: AtomicU64,
}

impl Rebuilt {
    /// Learn stored rows, in order.
    pub fn learn(&mut self, cfg: &LearnerConfig, rows: Vec<Stored>) {
        for row in rows {
            self.top = Some(self.top.map_or(row.key.0, |t| t.max(row.key.0)));
            self.tenants
                .entry(row.tenant.clone())
                .or_default()
                .learn(cfg, &row, &self.evicted);
        }
    }

    /// The rebuilt models.
    pub fn models(&self) -> BTreeMap<String, TenantModel> {
        self.tenants
            .iter()
            .map(|(k, b)| (k.clone(), b.model.clone()))
            .collect()
    }
}

/// One outcome learnt at once and not yet stored: when, its [`outcome_key`], what it is.
type Pending = (Instant, String, Arc<Observation>);

#[derive(Default)]
struct TenantState {
    served: Arc<TenantModel>,
    base: Base,
    /// Outcomes learnt at once, oldest first. Shared (`Arc`) so that serving anew can take
    /// them out of the lock ([`TenantState::trim_pending`]) without copying them.
    pending: VecDeque<Pending>,
    /// The feedback identities and the outcome keys of `pending`.
    pending_ids: HashSet<String>,
    pending_keys: HashSet<String>,
    /// Outcomes ever pushed onto `pending`: those pushed while a replay was computed out of
    /// the lock are the last `pushed - (pushed when it started)` of `pending` (only
    /// [`Live::learn_now`] adds, at the back; only the bulk learner holding `bulk` removes
    /// from the middle).
    pushed: u64,
    /// Candidate id -> (decisions without an outcome, last decision).
    inflight: HashMap<String, (u32, Instant)>,
    /// Held while a constrained decision is made ([`Live::constrained_gate`]).
    gate: Arc<parking_lot::Mutex<()>>,
    /// Held by the bulk learners ([`Live::reconcile`], [`Live::install`], [`Live::load`]),
    /// never by a request: one at a time may have the base's model out of the state, or
    /// compute a served model out of the lock.
    bulk: Arc<parking_lot::Mutex<()>>,
}

/// The pending outcomes a served model is to replay, taken under the lock by
/// [`TenantState::trim_pending`] and learnt out of it.
struct Replay {
    outcomes: Vec<Arc<Observation>>,
    /// [`TenantState::pushed`] when they were taken.
    pushed: u64,
}

impl TenantState {
    /// Under the lock, bookkeeping only (hash lookups, one `Arc` per outcome): drop the
    /// pending outcomes the base now holds, and those older than [`PENDING_MAX_AGE`]; the
    /// rest are to be replayed over the base.
    fn trim_pending(&mut self) -> Replay {
        let (applied, answered) = (&self.base.applied.set, &self.base.answered.set);
        let (ids, keys) = (&mut self.pending_ids, &mut self.pending_keys);
        self.pending.retain(|(at, key, p)| {
            let keep = at.elapsed() < PENDING_MAX_AGE
                && !applied.contains(&p.feedback_id)
                && !answered.contains(key);
            if !keep {
                ids.remove(&p.feedback_id);
                keys.remove(key);
            }
            keep
        });
        Replay {
            outcomes: self.pending.iter().map(|(_, _, p)| p.clone()).collect(),
            pushed: self.pushed,
        }
    }

    /// Under the lock: serve `served`, the base with a [`Replay`] taken when
    /// [`TenantState::pushed`] was `pushed_then` learnt over it, once the outcomes pushed
    /// since (learnt at once into the model served meanwhile, not into `served`) are
    /// learnt too: each outcome once. The model served until now is given back, to be
    /// dropped out of the lock.
    fn serve(
        &mut self,
        cfg: &LearnerConfig,
        mut served: TenantModel,
        pushed_then: u64,
    ) -> Arc<TenantModel> {
        let since = usize::try_from(self.pushed - pushed_then).unwrap_or(usize::MAX);
        let skip = self.pending.len().saturating_sub(since);
        for (_, _, p) in self.pending.iter().skip(skip) {
            served.learn(cfg, p);
        }
        std::mem::replace(&mut self.served, Arc::new(served))
    }
}

/// Every tenant's contextual state.
#[derive(Default)]
pub struct Live {
    tenants: RwLock<HashMap<String, Arc<RwLock<TenantState>>>>,
    /// Arms dropped from a model to stay within [`LearnerConfig::max_arms`]: by outcomes
    /// learnt at once, rows learnt at a refresh, and again by every full rebuild.
    evicted: AtomicU64,
    /// Outcomes not learnt at once because their tenant's pending list was full
    /// ([`PENDING_MAX`]); each counts from the refresh that reads it stored.
    deferred: AtomicU64,
    /// Called as a replay of pending outcomes starts, out of the tenant's lock (tests hold a
    /// replay there to act meanwhile).
    #[cfg(test)]
    replaying: parking_lot::Mutex<Option<Arc<dyn Fn() + Send + Sync>>>,
}

impl Live {
    fn tenant(&self, tenant: &str) -> Arc<RwLock<TenantState>> {
        if let Some(t) = self.tenants.read().get(tenant) {
            return t.clone();
        }
        self.tenants
            .write()
            .entry(tenant.to_owned())
            .or_default()
            .clone()
    }

    /// `true` when the base (what ClickHouse holds, as last read) has learnt this
    /// feedback identity.
    pub fn holds(&self, tenant: &str, feedback_id: &str) -> bool {
        self.tenants
            .read()
            .get(tenant)
            .is_some_and(|t| t.read().base.applied.set.contains(feedback_id))
    }

    /// The model decisions of `tenant` are served from (empty for an unknown tenant; no
    /// state is created by reading).
    pub fn model(&self, tenant: &str) -> Arc<TenantModel> {
        match self.tenants.read().get(tenant) {
            Some(t) => t.read().served.clone(),
            None => Arc::default(),
        }
    }

    /// Learn one of this replica's outcomes of `decision_id` at once (skipped when the base
    /// already holds its feedback identity or an outcome of the decision's candidate, or
    /// either is already pending).
    pub fn learn_now(
        &self,
        cfg: &LearnerConfig,
        tenant: &str,
        decision_id: &str,
        obs: Observation,
    ) -> bool {
        let key = outcome_key(decision_id, &obs.candidate_id);
        let t = self.tenant(tenant);
        let mut t = t.write();
        if t.base.applied.set.contains(&obs.feedback_id)
            || t.pending_ids.contains(&obs.feedback_id)
            || t.base.answered.set.contains(&key)
            || t.pending_keys.contains(&key)
        {
            return false;
        }
        // Full: this one counts from the refresh that reads it stored. Letting the oldest
        // go instead would keep it in the model served while forgetting its identity, so a
        // repeat of it would count twice until the next refresh.
        if t.pending.len() >= PENDING_MAX {
            self.deferred.fetch_add(1, Relaxed);
            return false;
        }
        if Arc::make_mut(&mut t.served).learn(cfg, &obs) {
            self.evicted.fetch_add(1, Relaxed);
        }
        t.pending_ids.insert(obs.feedback_id.clone());
        t.pending_keys.insert(key.clone());
        t.pending.push_back((Instant::now(), key, Arc::new(obs)));
        t.pushed += 1;
        true
    }

    /// Serve `tenant` anew: `served` (a copy of the base's model, made out of the lock) with
    /// the pending outcomes of `replay` learnt over it with the lock released (O(slots²)
    /// each, up to [`PENDING_MAX`] of them: decisions and feedback of the tenant go on
    /// meanwhile, from the model served until now), then swapped in under a short lock with
    /// the outcomes learnt at once meanwhile ([`TenantState::serve`]). The caller holds the
    /// tenant's `bulk` lock, so neither the base nor the pending list's middle changes
    /// meanwhile.
    fn serve_anew(
        &self,
        cfg: &LearnerConfig,
        t: &RwLock<TenantState>,
        mut served: TenantModel,
        replay: Replay,
    ) {
        #[cfg(test)]
        {
            let hook = self.replaying.lock().clone();
            if let Some(hook) = hook {
                hook();
            }
        }
        for p in &replay.outcomes {
            served.learn(cfg, p);
        }
        // The model served until now (its last reference, unless a decision holds it) is
        // dropped out of the lock.
        let before = t.write().serve(cfg, served, replay.pushed);
        drop(before);
    }

    /// Learn rows newly read from ClickHouse (in visibility order) into each tenant's base
    /// and rebuild its served model. `true` when a row came out of order (it became visible
    /// after a later one was learnt): the base then differs from a rebuild until the next
    /// [`Live::install`].
    pub fn reconcile(&self, cfg: &LearnerConfig, rows: Vec<Stored>) -> bool {
        let mut by_tenant: HashMap<String, Vec<Stored>> = HashMap::new();
        for row in rows {
            by_tenant.entry(row.tenant.clone()).or_default().push(row);
        }
        let mut late = false;
        for (tenant, rows) in by_tenant {
            let t = self.tenant(&tenant);
            let bulk = t.read().bulk.clone();
            let _one_bulk_learner = bulk.lock();
            // Under the state's lock, only the bookkeeping (hash lookups): the identities
            // are booked at once, so feedback posted meanwhile is not learnt again, and the
            // base's model is taken out. The rows are learnt into it with the lock released
            // (a page of a catch-up is seconds of O(slots²) updates, and every decision and
            // feedback of the tenant takes this lock); decisions meanwhile read the served
            // model, which is untouched until the model is put back and served anew.
            let (mut model, admitted) = {
                let mut t = t.write();
                let mut admitted = Vec::with_capacity(rows.len());
                for row in &rows {
                    if let Some(l) = t.base.admit(row) {
                        late |= l;
                        admitted.push(row);
                    }
                }
                (std::mem::take(&mut t.base.model), admitted)
            };
            for row in admitted {
                if model.learn(cfg, &row.obs) {
                    self.evicted.fetch_add(1, Relaxed);
                }
            }
            // Served anew out of the lock too: the copy and the replay of the pending
            // outcomes ([`Live::serve_anew`]).
            let served = model.clone();
            let replay = {
                let mut t = t.write();
                t.base.model = model;
                t.trim_pending()
            };
            self.serve_anew(cfg, &t, served, replay);
        }
        late
    }

    /// Replace every tenant's base with a rebuilt one (pending outcomes it now holds leave
    /// the pending list; the others stay on top).
    pub fn install(&self, cfg: &LearnerConfig, mut fresh: Rebuilt) {
        self.evicted.fetch_add(fresh.evicted.load(Relaxed), Relaxed);
        let mut names: HashSet<String> = self.tenants.read().keys().cloned().collect();
        names.extend(fresh.tenants.keys().cloned());
        for name in names {
            let t = self.tenant(&name);
            let bulk = t.read().bulk.clone();
            let _one_bulk_learner = bulk.lock();
            let base = fresh.tenants.remove(&name).unwrap_or_default();
            let served = base.model.clone();
            // The base replaced, under the lock; the former one (up to APPLIED_MAX identities
            // twice) is dropped out of it.
            let (before, replay) = {
                let mut t = t.write();
                let before = std::mem::replace(&mut t.base, base);
                (before, t.trim_pending())
            };
            drop(before);
            self.serve_anew(cfg, &t, served, replay);
        }
    }

    /// Start from a snapshot's models (before any refresh).
    pub fn load(&self, models: impl IntoIterator<Item = (String, TenantModel)>) {
        for (tenant, m) in models {
            let t = self.tenant(&tenant);
            let bulk = t.read().bulk.clone();
            let _one_bulk_learner = bulk.lock();
            let mut t = t.write();
            t.served = Arc::new(m.clone());
            t.base.model = m;
        }
    }

    /// The model `tenant` is served from, cloned (for `GET /v1/model` and tests).
    pub fn served(&self, tenant: &str) -> TenantModel {
        (*self.model(tenant)).clone()
    }

    /// Every tenant's served model.
    pub fn models(&self) -> Vec<(String, TenantModel)> {
        let names: Vec<String> = self.tenants.read().keys().cloned().collect();
        names
            .into_iter()
            .map(|k| {
                let m = self.served(&k);
                (k, m)
            })
            .collect()
    }

    /// Decisions of `tenant` in flight for `candidate` (expired after [`INFLIGHT_TIMEOUT`]).
    pub fn inflight(&self, tenant: &str, candidate: &str) -> u32 {
        let Some(t) = self.tenants.read().get(tenant).cloned() else {
            return 0;
        };
        let t = t.read();
        match t.inflight.get(candidate) {
            Some((n, at)) if at.elapsed() < INFLIGHT_TIMEOUT => *n,
            _ => 0,
        }
    }

    /// The lock a constrained decision of `tenant` holds from its admission (the risk
    /// budget's check) until [`Live::decided`] counts it.
    pub fn constrained_gate(&self, tenant: &str) -> Arc<parking_lot::Mutex<()>> {
        self.tenant(tenant).read().gate.clone()
    }

    /// An outcome arrived for a decision that chose `candidate`: one fewer in flight.
    pub fn settled(&self, tenant: &str, candidate: &str) {
        if let Some(t) = self.tenants.read().get(tenant) {
            if let Some(f) = t.write().inflight.get_mut(candidate) {
                f.0 = f.0.saturating_sub(1);
            }
        }
    }

    /// Count a decision for `candidate` as in flight.
    pub fn decided(&self, tenant: &str, candidate: &str) {
        let t = self.tenant(tenant);
        let mut t = t.write();
        if t.inflight.len() >= INFLIGHT_MAX && !t.inflight.contains_key(candidate) {
            prune_inflight(&mut t.inflight);
        }
        let e = t
            .inflight
            .entry(candidate.to_owned())
            .or_insert((0, Instant::now()));
        if e.1.elapsed() >= INFLIGHT_TIMEOUT {
            e.0 = 0;
        }
        e.0 += 1;
        e.1 = Instant::now();
    }

    /// Arms dropped so far to stay within [`LearnerConfig::max_arms`] (see [`Live`]).
    pub fn arms_evicted(&self) -> u64 {
        self.evicted.load(Relaxed)
    }

    /// Outcomes not learnt at once because the pending list was full (see [`Live`]).
    pub fn learn_deferred(&self) -> u64 {
        self.deferred.load(Relaxed)
    }

    /// Pending outcomes of `tenant`.
    pub fn pending(&self, tenant: &str) -> usize {
        self.tenants
            .read()
            .get(tenant)
            .map_or(0, |t| t.read().pending.len())
    }
}

/// The observations of stored (decision, feedback) rows; rows whose decision logged no
/// Run `f`, CPU-heavy (a page of outcomes parsed and learnt: up to `OUTCOMES_PAGE` rows, seconds
/// on a small machine), without holding up the tasks queued on this worker: on a
/// multi-threaded runtime the worker first hands them to another (`block_in_place`), so
/// `/v1/route` keeps answering during a rebuild. Elsewhere (a current-thread runtime, no
/// runtime) it just runs.
pub fn off_the_runtime<R>(f: impl FnOnce() -> R) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// features, or whose feedback names a candidate the decision did not offer, are skipped.
pub fn observations(rows: Vec<OutcomeRow>, pc: &PolicyConfig) -> Vec<Stored> {
    rows.into_iter()
        .filter_map(|r| {
            let d: Value = serde_json::from_str(&r.decision).ok()?;
            let f: Value = serde_json::from_str(&r.feedback).ok()?;
            let cand = f.get("candidate_id")?.as_str()?;
            let example = Remembered::from_payload(&d)?.example(cand)?;
            Some(Stored {
                tenant: r.tenant,
                key: (r.visible_us, r.feedback_id.clone()),
                decision_id: f.get("decision_id")?.as_str()?.to_owned(),
                obs: Observation {
                    feedback_id: r.feedback_id,
                    candidate_id: cand.to_owned(),
                    example,
                    outcome: Outcome::from_feedback(&f, &pc.weights, pc.prior_quality),
                },
            })
        })
        .collect()
}

/// Drop the expired entries, then, if still half full or more, all but the most recent
/// half: one pass per `INFLIGHT_MAX / 2` new candidates at most.
fn prune_inflight(inflight: &mut HashMap<String, (u32, Instant)>) {
    inflight.retain(|_, (_, at)| at.elapsed() < INFLIGHT_TIMEOUT);
    let keep = INFLIGHT_MAX / 2;
    if inflight.len() > keep {
        let mut times: Vec<Instant> = inflight.values().map(|(_, at)| *at).collect();
        let (_, cut, _) = times.select_nth_unstable_by(inflight.len() - keep, |a, b| b.cmp(a));
        let cut = *cut;
        inflight.retain(|_, (_, at)| *at > cut);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::{candidate_features, example};

    fn obs(id: &str, reward: f64) -> Observation {
        Observation {
            feedback_id: id.into(),
            candidate_id: "a".into(),
            example: example(&[], &candidate_features("a", "tool", None)),
            outcome: Outcome {
                reward,
                latency_ms: None,
                cost: 0.0,
                quality: None,
            },
        }
    }

    /// The model that learns `outcomes` (id, reward), in this order, from nothing.
    fn learnt(cfg: &LearnerConfig, outcomes: &[(&str, f64)]) -> TenantModel {
        let mut m = TenantModel::default();
        for (id, reward) in outcomes {
            m.learn(cfg, &obs(id, *reward));
        }
        m
    }

    fn stored(id: &str, at: i64, reward: f64) -> Stored {
        Stored {
            tenant: "t".into(),
            key: (at, id.into()),
            decision_id: format!("d-{id}"),
            obs: obs(id, reward),
        }
    }

    /// A large catch-up does not hold the tenant's lock while it learns: decisions
    /// (`model`, `inflight`, `decided`) and feedback (`learn_now`) go on meanwhile, and the
    /// result is the model learnt in one go, each outcome once.
    #[test]
    fn reconcile_learns_without_holding_the_tenants_lock() {
        use crate::features::Feature;
        let cfg = LearnerConfig::default();
        let ctx: Vec<Feature> = (0..24)
            .map(|h| Feature {
                hash: 1000 + h,
                value: 1.0,
            })
            .collect();
        let heavy = |i: usize| {
            let mut r = stored(&format!("f{i}"), i as i64, (i % 3) as f64 / 2.0);
            r.obs.example = example(&ctx, &candidate_features("a", "tool", None));
            r
        };
        let rows: Vec<Stored> = (0..3000).map(heavy).collect();
        let live = Arc::new(Live::default());
        live.decided("t", "warm");
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (l, d) = (live.clone(), done.clone());
        let prober = std::thread::spawn(move || {
            let mut worst = Duration::ZERO;
            while !d.load(Relaxed) {
                let at = Instant::now();
                let _ = l.model("t");
                l.decided("t", "b");
                l.settled("t", "b");
                worst = worst.max(at.elapsed());
                std::thread::sleep(Duration::from_micros(200));
            }
            worst
        });
        let started = Instant::now();
        live.reconcile(&cfg, rows.clone());
        let took = started.elapsed();
        done.store(true, Relaxed);
        let worst = prober.join().unwrap();
        assert!(
            worst < took / 4,
            "a request waited {worst:?} of the catch-up's {took:?}"
        );
        let whole = Live::default();
        let mut base = Base::default();
        let evicted = AtomicU64::new(0);
        for r in &rows {
            base.learn(&cfg, r, &evicted);
        }
        whole.load([("t".to_owned(), base.model)]);
        assert!(
            live.served("t") == whole.served("t"),
            "the model learnt in one go"
        );
        // Read again, every row is held: nothing changes.
        live.reconcile(&cfg, rows);
        assert!(live.served("t") == whole.served("t"), "each outcome once");
    }

    /// Long enough for any request on a loaded machine; a request still waiting then waits
    /// for the replay.
    const WAIT: Duration = Duration::from_secs(10);

    /// Run `bulk` (a reconcile or an install) on a thread, hold its replay of the pending
    /// outcomes as it starts, and run `meanwhile` on another thread then: its result, or
    /// `None` when it could not complete while the replay was held (it waited for the
    /// tenant's lock). The replay is let go on either way.
    fn during_replay<R: Send + 'static>(
        live: &Arc<Live>,
        bulk: impl FnOnce(&Live) + Send + 'static,
        meanwhile: impl FnOnce(&Live) -> R + Send + 'static,
    ) -> Option<R> {
        use std::sync::mpsc;
        let (entered_tx, entered_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let release_rx = parking_lot::Mutex::new(release_rx);
        *live.replaying.lock() = Some(Arc::new(move || {
            let _ = entered_tx.send(());
            // Returns once the sender is dropped.
            let _ = release_rx.lock().recv();
        }));
        let l = live.clone();
        let bulk = std::thread::spawn(move || bulk(&l));
        entered_rx.recv_timeout(WAIT).expect("the replay starts");
        let (done_tx, done_rx) = mpsc::channel();
        let l = live.clone();
        let request = std::thread::spawn(move || {
            let _ = done_tx.send(meanwhile(&l));
        });
        let during = done_rx.recv_timeout(WAIT).ok();
        drop(release_tx);
        *live.replaying.lock() = None;
        bulk.join().expect("the bulk learner");
        request.join().expect("the request");
        during
    }

    /// Serving anew replays the pending outcomes with the tenant's lock released: a
    /// decision (`model`, `decided`) and a feedback (`learn_now`) of the tenant complete
    /// while a refresh's replay is held, and the outcome learnt meanwhile is served once
    /// after it, with the replayed ones.
    #[test]
    fn decisions_and_feedback_go_on_while_a_refresh_replays_the_pending() {
        let cfg = LearnerConfig::default();
        let live = Arc::new(Live::default());
        assert!(live.learn_now(&cfg, "t", "d-p1", obs("p1", 1.0)));
        assert!(live.learn_now(&cfg, "t", "d-p2", obs("p2", 0.0)));
        let during = during_replay(
            &live,
            move |l| {
                l.reconcile(&cfg, vec![stored("s1", 1, 1.0)]);
            },
            move |l| {
                let served = l.model("t").updates;
                l.decided("t", "a");
                (served, l.learn_now(&cfg, "t", "d-p3", obs("p3", 1.0)))
            },
        );
        assert_eq!(
            during,
            Some((2, true)),
            "a decision and a feedback complete during the replay, from the model served until then"
        );
        assert_eq!(live.inflight("t", "a"), 1);
        // The base (s1), the pending replayed (p1, p2), then the one learnt meanwhile (p3).
        let expected = learnt(&cfg, &[("s1", 1.0), ("p1", 1.0), ("p2", 0.0), ("p3", 1.0)]);
        assert_eq!(live.served("t"), expected, "each outcome once");
        assert_eq!(live.pending("t"), 3);
        // Once p3 is stored it leaves the pending list: still once.
        live.reconcile(&cfg, vec![stored("p3", 2, 1.0)]);
        assert_eq!(live.pending("t"), 2);
        let expected = learnt(&cfg, &[("s1", 1.0), ("p3", 1.0), ("p1", 1.0), ("p2", 0.0)]);
        assert_eq!(live.served("t"), expected);
    }

    /// The exactly-once invariant across a rebuild's install whose replay runs while feedback
    /// arrives: an outcome the new base holds, one already pending, and another identity of
    /// a pending outcome are refused; a new one is learnt once, on top of the replay; once
    /// everything is stored the model served is the one rebuilt from ClickHouse.
    #[test]
    fn an_install_counts_each_outcome_once_with_feedback_during_its_replay() {
        let cfg = LearnerConfig::default();
        let live = Arc::new(Live::default());
        assert!(live.learn_now(&cfg, "t", "d-p1", obs("p1", 1.0)));
        assert!(live.learn_now(&cfg, "t", "d-p2", obs("p2", 1.0)));
        // The rebuild holds s0, and p1 (stored since).
        let rows = vec![stored("s0", 1, 0.0), stored("p1", 2, 1.0)];
        let mut fresh = Rebuilt::default();
        fresh.learn(&cfg, rows.clone());
        let mut expected = fresh.models()["t"].clone();
        let answers = during_replay(
            &live,
            move |l| l.install(&cfg, fresh),
            move |l| {
                [
                    l.learn_now(&cfg, "t", "d-p1", obs("p1", 1.0)),
                    l.learn_now(&cfg, "t", "d-p2", obs("p2", 1.0)),
                    l.learn_now(&cfg, "t", "d-p2", obs("p2-again", 1.0)),
                    l.learn_now(&cfg, "t", "d-p3", obs("p3", 0.0)),
                ]
            },
        );
        assert_eq!(answers, Some([false, false, false, true]));
        expected.learn(&cfg, &obs("p2", 1.0));
        expected.learn(&cfg, &obs("p3", 0.0));
        assert_eq!(live.served("t"), expected, "base, p2 replayed, p3 once");
        assert_eq!(live.pending("t"), 2);
        // Stored at last, in a refresh whose own replay has nothing left to replay.
        let later = vec![stored("p2", 3, 1.0), stored("p3", 4, 0.0)];
        assert!(!live.reconcile(&cfg, later.clone()));
        assert_eq!(live.pending("t"), 0);
        let mut all = Rebuilt::default();
        all.learn(&cfg, [rows, later].concat());
        assert_eq!(live.served("t"), all.models()["t"]);
    }

    /// A full pending list takes no more outcomes, during a replay too: the first to fill it
    /// is learnt once, at the swap; the others count from the refresh that reads them
    /// stored. No outcome learnt is forgotten, so a repeat of the oldest still counts once
    /// (letting the oldest go to make room counted such a repeat twice).
    #[test]
    fn a_full_pending_list_defers_new_outcomes_and_counts_each_once() {
        let cfg = LearnerConfig::default();
        let live = Arc::new(Live::default());
        {
            let t = live.tenant("t");
            let mut t = t.write();
            for i in 0..PENDING_MAX - 1 {
                let (id, key) = (format!("old{i}"), outcome_key(&format!("d-old{i}"), "a"));
                t.pending_ids.insert(id.clone());
                t.pending_keys.insert(key.clone());
                t.pending
                    .push_back((Instant::now(), key, Arc::new(obs(&id, 1.0))));
                t.pushed += 1;
            }
        }
        let during = during_replay(
            &live,
            move |l| l.install(&cfg, Rebuilt::default()),
            move |l| {
                (0..3)
                    .map(|i| {
                        l.learn_now(
                            &cfg,
                            "t",
                            &format!("d-new{i}"),
                            obs(&format!("new{i}"), 0.0),
                        )
                    })
                    .collect::<Vec<_>>()
            },
        );
        assert_eq!(during, Some(vec![true, false, false]));
        assert_eq!(live.learn_deferred(), 2);
        assert_eq!(live.pending("t"), PENDING_MAX);
        // The replay learnt the PENDING_MAX - 1 old ones; the swap the one new one taken.
        assert_eq!(live.model("t").updates, PENDING_MAX as u64);
        // The oldest, posted again: still pending, so not learnt a second time.
        assert!(!live.learn_now(&cfg, "t", "d-old0", obs("old0", 1.0)));
        assert_eq!(live.model("t").updates, PENDING_MAX as u64);
        // Served anew from what is pending: the same outcomes, each once.
        live.install(&cfg, Rebuilt::default());
        assert_eq!(live.model("t").updates, PENDING_MAX as u64);
    }

    #[test]
    fn each_outcome_counts_once_across_replicas_and_refreshes() {
        let cfg = LearnerConfig::default();
        let (r1, r2) = (Live::default(), Live::default());
        // Replica 1 hears f1, replica 2 hears f2: each learns its own at once.
        assert!(r1.learn_now(&cfg, "t", "d-f1", obs("f1", 1.0)));
        assert!(
            !r1.learn_now(&cfg, "t", "d-f1", obs("f1", 1.0)),
            "twice is once"
        );
        assert!(r2.learn_now(&cfg, "t", "d-f2", obs("f2", 0.0)));
        assert_eq!(r1.model("t").updates, 1);
        // ClickHouse has stored both, one of them twice; read again in an overlapping window.
        let rows = vec![
            stored("f1", 1, 1.0),
            stored("f2", 2, 0.0),
            stored("f1", 1, 1.0),
        ];
        let mut fresh = Rebuilt::default();
        fresh.learn(&cfg, rows.clone());
        assert_eq!(fresh.top, Some(2));
        let rebuilt = fresh.models()["t"].clone();
        assert_eq!(rebuilt, learnt(&cfg, &[("f1", 1.0), ("f2", 0.0)]));
        r1.install(&cfg, fresh);
        assert!(!r2.reconcile(&cfg, rows.clone()));
        assert!(!r2.reconcile(&cfg, rows[1..].to_vec()));
        assert_eq!(*r1.model("t"), rebuilt);
        assert_eq!(*r2.model("t"), rebuilt);
        // An outcome heard after the refresh, not yet stored, stays on top of the base.
        r1.learn_now(&cfg, "t", "d-f3", obs("f3", 1.0));
        r1.reconcile(&cfg, vec![]);
        assert_eq!(r1.model("t").updates, 3);
        assert!(
            !r1.learn_now(&cfg, "t", "d-f2", obs("f2", 0.0)),
            "already in the base"
        );
        // A row that becomes visible before the last one learnt is reported as late.
        assert!(r2.reconcile(&cfg, vec![stored("f0", 0, 1.0)]));
    }

    /// An outcome whose decision was never stored never comes back from ClickHouse: after
    /// [`PENDING_MAX_AGE`] it leaves the pending list (it was replayed at every refresh).
    #[test]
    fn a_pending_outcome_that_never_comes_back_leaves_after_its_age() {
        let cfg = LearnerConfig::default();
        let l = Live::default();
        assert!(l.learn_now(&cfg, "t", "d-lost", obs("lost", 1.0)));
        assert!(l.learn_now(&cfg, "t", "d-fresh", obs("fresh", 1.0)));
        let old = Instant::now()
            .checked_sub(PENDING_MAX_AGE + Duration::from_secs(1))
            .expect("the clock is past the age");
        l.tenant("t").write().pending[0].0 = old;
        l.install(&cfg, Rebuilt::default());
        assert_eq!(l.pending("t"), 1, "only the fresh one stays");
        assert_eq!(l.model("t").updates, 1);
        assert!(
            l.learn_now(&cfg, "t", "d-lost", obs("lost", 1.0)),
            "it is no longer pending"
        );
    }

    /// One outcome per candidate of a decision: a feedback posted again (through another
    /// replica, so not stamped alike, or with another timestamp) is another identity of the
    /// same outcome. It is held, not learnt, by the base and by the pending list alike.
    #[test]
    fn a_second_feedback_of_one_decision_is_not_learnt_again() {
        let cfg = LearnerConfig::default();
        let (r1, r2) = (Live::default(), Live::default());
        assert!(r1.learn_now(&cfg, "t", "d-1", obs("f1", 1.0)));
        assert!(!r1.learn_now(&cfg, "t", "d-1", obs("f1-again", 1.0)));
        assert!(r2.learn_now(&cfg, "t", "d-1", obs("f1-again", 1.0)));
        let mut again = stored("f1-again", 2, 1.0);
        again.decision_id = "d-1".into();
        let mut first = stored("f1", 1, 1.0);
        first.decision_id = "d-1".into();
        let rows = vec![first, again];
        let mut fresh = Rebuilt::default();
        fresh.learn(&cfg, rows.clone());
        assert_eq!(fresh.models()["t"].updates, 1);
        assert!(!r2.reconcile(&cfg, rows));
        assert_eq!(
            r2.model("t").updates,
            1,
            "the pending copy left with the stored one"
        );
        assert_eq!(r2.pending("t"), 0);
        assert!(r2.holds("t", "f1-again"), "held, so the overlay lets it go");
        // A fallback that ran instead is another candidate's outcome: learnt.
        let mut fallback = obs("f1-b", 0.0);
        fallback.candidate_id = "b".into();
        assert!(r2.learn_now(&cfg, "t", "d-1", fallback));
    }

    #[test]
    fn inflight_counts_until_the_outcome() {
        let cfg = LearnerConfig::default();
        let l = Live::default();
        l.decided("t", "a");
        l.decided("t", "a");
        assert_eq!(l.inflight("t", "a"), 2);
        l.learn_now(&cfg, "t", "d-f1", obs("f1", 1.0));
        assert_eq!(l.inflight("t", "a"), 2, "learning is not settling");
        l.settled("t", "a");
        assert_eq!(l.inflight("t", "a"), 1);
        assert_eq!(l.inflight("u", "a"), 0);
    }

    #[test]
    fn the_inflight_map_stays_bounded_and_keeps_the_recent() {
        let l = Live::default();
        for i in 0..INFLIGHT_MAX * 3 {
            l.decided("t", &format!("c-{i}"));
        }
        let t = l.tenant("t");
        let t = t.read();
        assert!(t.inflight.len() <= INFLIGHT_MAX, "{}", t.inflight.len());
        assert!(t
            .inflight
            .contains_key(&format!("c-{}", INFLIGHT_MAX * 3 - 1)));
    }
}
