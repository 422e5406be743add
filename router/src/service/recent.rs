//! The memory of recent decisions, for their feedback: bounded in count and bytes, fair
//! between tenants.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::decide::Remembered;

/// Bounded memory of recent decisions, per tenant and decision id: what their feedback
/// needs (the context key to stamp, the features to learn from). A tenant's feedback can
/// only ever find its own decisions here.
///
/// At most [`RECENT_MAX`] decisions and [`RECENT_MAX_BYTES`] in all: a decision of 64
/// candidates with long ids and many features holds some 36 KB, so the count alone would
/// allow several GB. When full, the oldest decision of the tenant that holds the most bytes
/// goes first, so a busy tenant cannot push a quiet one's decisions out: it only ever evicts
/// its own until the two hold as much.
#[derive(Default)]
pub(super) struct Recent {
    pub(super) tenants: HashMap<String, TenantRecent>,
    pub(super) len: usize,
    pub(super) bytes: usize,
}

/// One tenant's recent decisions, oldest first in `order`.
#[derive(Default)]
pub(super) struct TenantRecent {
    pub(super) map: HashMap<String, Arc<Remembered>>,
    pub(super) order: VecDeque<String>,
    pub(super) bytes: usize,
}

/// Decisions remembered at most, all tenants together.
pub const RECENT_MAX: usize = 200_000;
/// Bytes of remembered decisions at most, all tenants together (about, see
/// [`Remembered::bytes`]).
pub const RECENT_MAX_BYTES: usize = 256 << 20;

/// What [`Recent`] may hold.
#[derive(Debug, Clone, Copy)]
pub(super) struct RecentCap {
    pub(super) decisions: usize,
    pub(super) bytes: usize,
}

impl Recent {
    pub(super) fn insert(&mut self, tenant: &str, decision_id: String, r: Arc<Remembered>) {
        let cap = RecentCap {
            decisions: RECENT_MAX,
            bytes: RECENT_MAX_BYTES,
        };
        self.insert_capped(tenant, decision_id, r, cap);
    }

    /// The bytes an entry holds: the decision id twice (map key and order) and its features.
    pub(super) fn size(decision_id: &str, r: &Remembered) -> usize {
        2 * decision_id.len() + r.bytes()
    }

    pub(super) fn insert_capped(
        &mut self,
        tenant: &str,
        decision_id: String,
        r: Arc<Remembered>,
        cap: RecentCap,
    ) {
        let size = Self::size(&decision_id, &r);
        while self.len > 0 && (self.len >= cap.decisions || self.bytes + size > cap.bytes) {
            // A scan of the tenants: there are as many as API keys name.
            let largest = self.tenants.iter_mut().max_by_key(|(_, t)| t.bytes);
            let Some((_, t)) = largest else { break };
            let Some(old) = t.order.pop_front() else {
                break;
            };
            if let Some(gone) = t.map.remove(&old) {
                let freed = Self::size(&old, &gone);
                t.bytes -= freed;
                self.bytes -= freed;
                self.len -= 1;
            }
        }
        let t = self.tenants.entry(tenant.to_owned()).or_default();
        if !t.map.contains_key(&decision_id) {
            t.order.push_back(decision_id.clone());
            t.map.insert(decision_id, r);
            t.bytes += size;
            self.bytes += size;
            self.len += 1;
        }
    }

    pub(super) fn get(&self, tenant: &str, decision_id: &str) -> Option<Arc<Remembered>> {
        self.tenants.get(tenant)?.map.get(decision_id).cloned()
    }
}
