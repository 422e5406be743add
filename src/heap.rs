//! The heap as jemalloc counts it, on `weft ingest`'s `/metrics`: what the process has
//! allocated and not freed (librdkafka's allocations included, since jemalloc also serves C's
//! `malloc`), and the pages jemalloc holds for it. Resident memory beside these two says
//! whether a rise is live state (allocated), freed memory not yet given back (resident minus
//! allocated), or memory outside the heap (RSS minus resident).

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::IntGauge;
use tikv_jemalloc_ctl::{epoch, stats};

/// `weft_heap_allocated_bytes` and `weft_heap_resident_bytes`, read from jemalloc at each
/// scrape.
#[derive(Clone)]
pub(crate) struct Heap {
    allocated: IntGauge,
    resident: IntGauge,
}

impl Heap {
    pub(crate) fn new() -> Self {
        // Constant, valid names: a failure here is a programming error the unit test catches.
        let gauge = |name: &str, help: &str| {
            IntGauge::new(name, help).unwrap_or_else(|e| panic!("metric {name}: {e}"))
        };
        Self {
            allocated: gauge(
                "weft_heap_allocated_bytes",
                "Bytes allocated and not yet freed (jemalloc stats.allocated)",
            ),
            resident: gauge(
                "weft_heap_resident_bytes",
                "Bytes in pages jemalloc holds, freed ones not yet returned included (stats.resident)",
            ),
        }
    }

    /// jemalloc's counts as of now (its statistics are refreshed by advancing its epoch).
    fn read() -> Option<(usize, usize)> {
        epoch::advance().ok()?;
        Some((
            stats::allocated::read().ok()?,
            stats::resident::read().ok()?,
        ))
    }
}

impl Collector for Heap {
    fn desc(&self) -> Vec<&Desc> {
        self.allocated
            .desc()
            .into_iter()
            .chain(self.resident.desc())
            .collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        // A failed read keeps the last values; jemalloc's mallctl does not fail once built.
        if let Some((allocated, resident)) = Self::read() {
            self.allocated
                .set(i64::try_from(allocated).unwrap_or(i64::MAX));
            self.resident
                .set(i64::try_from(resident).unwrap_or(i64::MAX));
        }
        let mut out = self.allocated.collect();
        out.extend(self.resident.collect());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The gauges come from jemalloc (the global allocator): a live allocation is counted,
    /// and the pages holding it are at least as many bytes.
    #[test]
    fn counts_the_live_heap() {
        let block = vec![1u8; 8 << 20];
        let families = Heap::new().collect();
        let value = |name: &str| {
            families
                .iter()
                .find(|f| f.name() == name)
                .map(|f| f.get_metric()[0].get_gauge().get_value())
                .unwrap_or_else(|| panic!("no {name}"))
        };
        let allocated = value("weft_heap_allocated_bytes");
        assert!(allocated >= block.len() as f64, "allocated {allocated}");
        assert!(value("weft_heap_resident_bytes") >= allocated);
        drop(block);
    }
}
