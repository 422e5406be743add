//! The fitted state: per tenant x context x candidate statistics, as read from the
//! `weft_router_stats` aggregates (decayed), and the versioned snapshot file format.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The snapshot file's `format` value.
pub const SNAPSHOT_FORMAT: &str = "weft-router-snapshot";
/// The snapshot file's `version` value (bumped on incompatible changes).
pub const SNAPSHOT_VERSION: u32 = 1;

/// Decayed outcome statistics of one candidate in one context. Counts are `f64` because
/// the decay weights them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ArmStats {
    /// Feedback count, decayed.
    pub n: f64,
    /// Feedback reporting success, decayed.
    pub successes: f64,
    /// Feedback reporting a latency, decayed; the denominator of the mean latency.
    pub latency_n: f64,
    /// Sum of reported latencies (ms), decayed.
    pub latency_sum: f64,
    /// Latency quantiles (p50, p90, p99) over the window, undecayed; `None` when unknown.
    pub latency_q: Option<[f64; 3]>,
    /// Sum of costs (`cost.usd`, else `cost.amount`), decayed; divided by `n` for the mean.
    pub cost_sum: f64,
    /// Feedback reporting a `quality_score`, decayed.
    pub quality_n: f64,
    /// Sum of reported quality scores, decayed.
    pub quality_sum: f64,
}

impl ArmStats {
    /// Add one observed outcome (used by `weft eval` to fit from logged data, and by tests).
    pub fn observe(
        &mut self,
        success: bool,
        latency_ms: Option<f64>,
        cost: f64,
        quality: Option<f64>,
    ) {
        self.n += 1.0;
        if success {
            self.successes += 1.0;
        }
        if let Some(l) = latency_ms {
            self.latency_n += 1.0;
            self.latency_sum += l;
        }
        self.cost_sum += cost;
        if let Some(q) = quality {
            self.quality_n += 1.0;
            self.quality_sum += q;
        }
    }

    /// Mean reported latency (ms); `None` before any latency was reported.
    pub fn mean_latency(&self) -> Option<f64> {
        (self.latency_n > 0.0).then(|| self.latency_sum / self.latency_n)
    }

    /// The latency used against `max_latency_ms`: the p90 when known, else the mean.
    pub fn latency_bound(&self) -> Option<f64> {
        match self.latency_q {
            Some(q) if q[1].is_finite() => Some(q[1]),
            _ => self.mean_latency(),
        }
    }

    /// Mean cost per feedback; `None` before any feedback.
    pub fn mean_cost(&self) -> Option<f64> {
        (self.n > 0.0).then(|| self.cost_sum / self.n)
    }

    /// Mean quality score; `None` before any score was reported.
    pub fn mean_quality(&self) -> Option<f64> {
        (self.quality_n > 0.0).then(|| self.quality_sum / self.quality_n)
    }
}

/// Statistics per candidate id.
pub type Arms = BTreeMap<String, ArmStats>;

/// Everything the router learned, per tenant, then per context key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Must be [`SNAPSHOT_FORMAT`]; loading refuses anything else.
    pub format: String,
    /// Must be [`SNAPSHOT_VERSION`]; loading refuses other versions.
    pub version: u32,
    /// When the statistics were read (RFC 3339).
    pub created_at: String,
    /// Where they came from (`clickhouse:<db>`, `file:<path>`, `priors`, `logged-data`).
    pub source: String,
    /// Half-life of the decay applied when reading, in seconds (0 = none).
    #[serde(default)]
    pub half_life_s: f64,
    /// tenant -> context key -> candidate id -> statistics.
    pub tenants: BTreeMap<String, BTreeMap<String, Arms>>,
    /// tenant -> the contextual model (`squarecb`), as rebuilt from the stored decisions
    /// and their feedback; absent in files written before it existed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub contextual: BTreeMap<String, crate::learner::TenantModel>,
}

impl Snapshot {
    /// An empty snapshot: every decision runs on the priors.
    pub fn empty(source: &str) -> Self {
        Snapshot {
            format: SNAPSHOT_FORMAT.into(),
            version: SNAPSHOT_VERSION,
            created_at: weft_schemas::time::now_rfc3339(),
            source: source.into(),
            half_life_s: 0.0,
            tenants: BTreeMap::new(),
            contextual: BTreeMap::new(),
        }
    }

    /// The arms of one tenant's context, if any feedback was seen there.
    pub fn arms(&self, tenant: &str, context: &str) -> Option<&Arms> {
        self.tenants.get(tenant)?.get(context)
    }

    /// Mutable arms (created on demand).
    pub fn arms_mut(&mut self, tenant: &str, context: &str) -> &mut Arms {
        self.tenants
            .entry(tenant.to_owned())
            .or_default()
            .entry(context.to_owned())
            .or_default()
    }

    /// Parse and check a snapshot file's text (its format, its version, and that each
    /// contextual model's sizes agree: [`crate::learner::TenantModel::check`]).
    pub fn from_json(text: &str) -> Result<Self, String> {
        let s: Snapshot = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if s.format != SNAPSHOT_FORMAT {
            return Err(format!(
                "format is `{}`, expected `{SNAPSHOT_FORMAT}`",
                s.format
            ));
        }
        if s.version != SNAPSHOT_VERSION {
            return Err(format!(
                "snapshot version {} is not supported (this weft reads {SNAPSHOT_VERSION})",
                s.version
            ));
        }
        for (tenant, m) in &s.contextual {
            m.check()
                .map_err(|e| format!("contextual model of tenant `{tenant}`: {e}"))?;
        }
        Ok(s)
    }

    /// Tenants holding at least `max_cells` cells (the read's bound: some may have been left
    /// out).
    pub fn tenants_at(&self, max_cells: u64) -> usize {
        self.tenants
            .values()
            .filter(|c| c.values().map(|a| a.len() as u64).sum::<u64>() >= max_cells)
            .count()
    }

    /// Number of (tenant, context, candidate) cells.
    pub fn cells(&self) -> usize {
        self.tenants
            .values()
            .flat_map(|c| c.values())
            .map(|a| a.len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_round_trips_and_checks_its_version() {
        let mut s = Snapshot::empty("test");
        s.arms_mut("acme", "search")
            .entry("a".into())
            .or_default()
            .observe(true, Some(100.0), 0.5, Some(0.9));
        let text = serde_json::to_string(&s).unwrap();
        assert_eq!(Snapshot::from_json(&text).unwrap(), s);
        assert_eq!(s.cells(), 1);
        let bad = text.replace("\"version\":1", "\"version\":99");
        assert!(Snapshot::from_json(&bad)
            .unwrap_err()
            .contains("version 99"));
    }

    #[test]
    fn a_contextual_model_whose_sizes_disagree_is_refused_at_load() {
        use crate::learner::TenantModel;
        let consistent = TenantModel {
            slots: [(7, 0), (9, 1)].into_iter().collect(),
            w: vec![0.5, -0.5],
            p: vec![1.0, 0.0, 0.0, 1.0],
            slot_use: vec![(1, 1)],
            ..TenantModel::default()
        };
        let with = |m: TenantModel| {
            let mut s = Snapshot::empty("test");
            s.contextual.insert("acme".into(), m);
            Snapshot::from_json(&serde_json::to_string(&s).unwrap())
        };
        assert!(with(consistent.clone()).is_ok());
        let broken = [
            (
                TenantModel {
                    p: vec![1.0; 3],
                    ..consistent.clone()
                },
                "p has 3 entries",
            ),
            (
                TenantModel {
                    slots: [(7, 0), (9, 2)].into_iter().collect(),
                    ..consistent.clone()
                },
                "slot 2",
            ),
            (
                TenantModel {
                    slot_use: vec![(1, 1); 3],
                    ..consistent.clone()
                },
                "slot_use has 3 entries",
            ),
        ];
        for (m, why) in broken {
            let e = with(m).unwrap_err();
            assert!(e.contains("tenant `acme`") && e.contains(why), "{e}");
        }
    }
}
