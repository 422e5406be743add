//! Step 5: the per-event CPU of each ingest step, offline, on a sample (where the time goes).

use super::*;

/// Topic, value and headers of one encoded record.
type WireRecord = (String, Vec<u8>, Vec<(&'static str, String)>);

/// The per-event CPU of each ingest step on `n` simulated events, on this thread.
pub(super) fn step_costs(cfg: SimConfig, n: usize, topics: &Topics) -> anyhow::Result<Vec<Step>> {
    let now = weft_schemas::time::now_rfc3339();
    let envs: Vec<Envelope> = Simulation::new(cfg)?
        .take(n)
        .enumerate()
        .map(|(i, e)| stamp(e, i as u64 + 1, &now))
        .collect();
    let n = envs.len().max(1) as f64;
    let ids = SchemaIds::default();
    let records: Vec<WireRecord> = envs
        .iter()
        .map(|e| {
            Ok((
                topics.topic(e.kind),
                wire::encode_value(e, ContentType::Json, &ids)?,
                wire::encode_headers(e, ContentType::Json),
            ))
        })
        .collect::<anyhow::Result<_>>()?;
    let mut steps = Vec::new();
    let mut time = |step: &'static str, f: &mut dyn FnMut()| {
        let t = cpu::rusage(Who::Thread);
        f();
        steps.push(Step {
            step,
            us_per_event: (cpu::rusage(Who::Thread) - t) / n * 1e6,
        });
    };
    // What `accept` does per record before decoding: own the message, then borrow it.
    let mut owned = Vec::with_capacity(records.len());
    time("copy record out of librdkafka (to_vec)", &mut || {
        for (t, v, h) in &records {
            let hv: Vec<(String, Vec<u8>)> = h
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
                .collect();
            owned.push((t.clone(), v.clone(), hv));
        }
    });
    let mut facts = Vec::with_capacity(records.len());
    let decode_all = |facts: &mut Vec<decode::Fact>| {
        for (i, (t, v, h)) in owned.iter().enumerate() {
            let hs: Vec<(&str, &[u8])> =
                h.iter().map(|(k, v)| (k.as_str(), v.as_slice())).collect();
            let rec = Record {
                topic: t,
                partition: 0,
                offset: i as i64,
                key: None,
                value: Some(v),
                headers: &hs,
                timestamp_ms: Some(0),
            };
            if let Ok(f) = decode::decode(&rec, topics, &ids) {
                facts.push(f);
            }
        }
    };
    time(
        "decode total (wire + validate + JCS/SHA-256 + links)",
        &mut || decode_all(&mut facts),
    );
    let mut wired = Vec::with_capacity(records.len());
    time(
        "  wire::decode (headers, JSON well-formedness)",
        &mut || {
            for (t, v, h) in &owned {
                let hs: Vec<(&str, &[u8])> =
                    h.iter().map(|(k, v)| (k.as_str(), v.as_slice())).collect();
                if let Ok((env, _)) = wire::decode(&hs, v, topics.kind_of(t), &ids) {
                    wired.push(env);
                }
            }
        },
    );
    let mut values = Vec::with_capacity(wired.len());
    time(
        "  Envelope::validate (parse + JSON Schema + identity)",
        &mut || {
            for e in &wired {
                if let Ok((v, _)) = e.validate() {
                    values.push((e.kind, v));
                }
            }
        },
    );
    // Two parts of the validation above, apart.
    time(
        "    strict parse (serde_json::Value, duplicate keys)",
        &mut || {
            for e in &wired {
                std::hint::black_box(weft_schemas::strict::parse(e.payload.get()).ok());
            }
        },
    );
    time("    JSON Schema (is_valid)", &mut || {
        let validator = weft_schemas::Validator::global();
        for (k, v) in &values {
            std::hint::black_box(validator.is_valid(k.schema_name(), v).ok());
        }
    });
    time(
        "  canonical JSON (RFC 8785; SHA-256 not included)",
        &mut || {
            let mut out = Vec::with_capacity(1024);
            for (_, v) in &values {
                out.clear();
                std::hint::black_box(identity::write_canonical(v, &mut out).ok());
            }
        },
    );
    time("  links::extract", &mut || {
        for (k, v) in &values {
            std::hint::black_box(links::extract(*k, v));
        }
    });
    let mut rows = Vec::with_capacity(facts.len());
    time("EventRow::new (typed columns, payload copy)", &mut || {
        for (i, f) in facts.iter().enumerate() {
            rows.push(EventRow::new(f, "t", 0, i as i64, 0, false));
        }
    });
    time(
        "dedup (identity key SHA-256 + id hash + cache)",
        &mut || {
            let mut cache =
                DedupCache::new(weft_consumers::ingest::IngestConfig::default().dedup_limits());
            for f in &facts {
                let (tenant, kind) = (&f.envelope.tenant, f.envelope.kind.as_str());
                let k = identity_key(tenant, kind, &f.id);
                let h = weft_store::ids::id_hash(tenant, kind, &f.id);
                let c = copy_hash(
                    &f.content_hash,
                    f.envelope.request_id.as_deref().unwrap_or(""),
                );
                std::hint::black_box(cache.observe(k, h, c));
            }
        },
    );
    time("serialize rows (serde_json, for scale only)", &mut || {
        for r in &rows {
            std::hint::black_box(serde_json::to_vec(r).ok());
        }
    });
    std::hint::black_box((&rows, &facts));
    Ok(steps)
}
