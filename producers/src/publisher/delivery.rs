//! Sending to Kafka: the direct path of `publish`, librdkafka's delivery reports, and the
//! replacement of a tainted producer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Header, Headers, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, PurgeConfig};
use rdkafka::{ClientContext, Message};
use tokio::sync::oneshot;
use tracing::{debug, error, info, warn};
use weft_schemas::wire::{self, ContentType};
use weft_schemas::{extensions, Envelope, Kind};

use super::receipt::{Delivery, Receipt, Reply};
use super::state::{lock, read, write, Job, Kafka, Shared};
use super::{kind_index, PublishError, Publisher};
use crate::spool::{Spool, SpoolRecord};

/// What rides with each message through librdkafka, back to the delivery callback.
pub(super) enum Pending {
    Live { reply: Reply, started: Instant },
    Replay(mpsc::Sender<(usize, Result<(), KafkaError>)>, usize),
}

/// librdkafka's callbacks: route each delivery report back to its waiter or the spool.
pub(super) struct Ctx {
    pub(super) shared: Arc<Shared>,
    /// Set on the first retriable delivery failure; the instance is then retired.
    pub(super) tainted: AtomicBool,
}

impl ClientContext for Ctx {}

/// Errors after which resending the same bytes can never succeed.
pub(super) fn is_permanent(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::InvalidMessageSize
                | RDKafkaErrorCode::InvalidMessage
                | RDKafkaErrorCode::InvalidRecord
                | RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::InvalidTopic
        )
    )
}

/// The broker's answer that a record's topic or partition does not exist, or that this
/// producer may not write to the cluster: Kafka is up and saying no (a topic deleted behind
/// the spool's back), unlike a timeout or a lost connection, which say nothing. Retriable
/// all the same (a topic may be created again), unlike [`is_permanent`].
pub(super) fn is_refusal(e: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(
            C::UnknownTopicOrPartition
                | C::UnknownTopic
                | C::UnknownPartition
                | C::ClusterAuthorizationFailed
        )
    )
}

impl ProducerContext for Ctx {
    type DeliveryOpaque = Box<Pending>;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: Box<Pending>) {
        let sh = &self.shared;
        match (*opaque, result) {
            (Pending::Replay(tx, i), r) => {
                if let Err((e, _)) = r {
                    if !is_permanent(e) {
                        self.tainted.store(true, Ordering::SeqCst);
                    }
                }
                let _ = tx.send((i, r.as_ref().map(|_| ()).map_err(|(e, _)| e.clone())));
            }
            (Pending::Live { reply, started }, Ok(msg)) => {
                let idle = {
                    let mut st = lock(&sh.state);
                    st.in_flight -= 1;
                    sh.release_held(&mut st);
                    sh.maybe_resume_direct(&mut st);
                    st.acked += 1;
                    // A paced `publish` waits for in_flight to fall below the bound.
                    st.in_flight == 0 || st.pacers > 0
                };
                // Waiters (close, wait_drained) wait for nothing in flight, a paced publish for
                // room; waking them for every acknowledgement would cost a futex call per event.
                if idle {
                    sh.changed.notify_all();
                }
                sh.metrics.published.inc();
                sh.metrics
                    .publish_latency
                    .observe(started.elapsed().as_secs_f64());
                let _ = reply.send(Ok(Delivery::Kafka {
                    partition: msg.partition(),
                    offset: msg.offset(),
                }));
            }
            (Pending::Live { reply, started }, Err((e, msg))) => {
                let mut st = lock(&sh.state);
                st.in_flight -= 1;
                if is_permanent(e) {
                    error!(error = %e, topic = msg.topic(), "Kafka refused an event for good");
                    sh.release_held(&mut st);
                    sh.maybe_resume_direct(&mut st);
                    drop(st);
                    sh.changed.notify_all();
                    let _ = reply.send(Err(PublishError::Kafka(e.clone())));
                    return;
                }
                self.tainted.store(true, Ordering::SeqCst);
                if !st.spooling {
                    warn!(error = %e, "delivery failed; spooling events until Kafka is back");
                    st.spooling = true;
                }
                let record = SpoolRecord {
                    topic: msg.topic().to_owned(),
                    key: msg.key().map(<[u8]>::to_vec),
                    value: msg.payload().unwrap_or_default().to_vec(),
                    headers: msg
                        .headers()
                        .map(|h| {
                            h.iter()
                                .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
                                .collect()
                        })
                        .unwrap_or_default(),
                };
                // Already accepted by `publish`: it must be spooled even past the soft bound
                // (the spool itself enforces the hard one and reports SpoolFull).
                let size = Spool::size_of(std::slice::from_ref(&record));
                let job = Job {
                    record,
                    size,
                    reply: Some(reply),
                    started,
                };
                sh.to_writer(&mut st, job);
                sh.release_held(&mut st);
                drop(st);
                sh.changed.notify_all();
                sh.wake.notify_all();
            }
        }
    }
}

impl Shared {
    /// Whether the current producer saw a delivery failure and must be replaced.
    pub(super) fn producer_tainted(&self) -> bool {
        read(&self.producer)
            .as_ref()
            .is_none_or(|p| p.context().tainted.load(Ordering::SeqCst))
    }

    /// Replace a tainted producer: new instance first (so nothing is ever sent through the
    /// old one again), then purge the old one, whose queued events fail and are spooled.
    pub(super) fn replace_producer_if_tainted(self: &Arc<Self>) {
        if !self.producer_tainted() || self.shutdown.load(Ordering::SeqCst) {
            return;
        }
        let fresh: Result<Kafka, KafkaError> = self.kafka_config.create_with_context(Ctx {
            shared: self.clone(),
            tainted: AtomicBool::new(false),
        });
        let fresh = match fresh {
            Ok(p) => p,
            Err(e) => {
                error!(error = %e, "cannot create a new Kafka producer");
                return;
            }
        };
        let old = write(&self.producer).replace(fresh);
        info!("replaced the Kafka producer after delivery failures (new producer id)");
        if let Some(old) = old {
            // Queued events fail now (and are spooled). Requests already on the wire are let
            // finish, so the broker never sees a connection torn down mid-request.
            old.purge(PurgeConfig::default().queue());
            let _ = old.flush(Duration::from_secs(30));
            // Dropping joins its polling thread.
            drop(old);
        }
    }
}

impl Publisher {
    /// Count and log the payload's nonconforming top-level keys; `Err` when configured to
    /// refuse them.
    fn check_keys(&self, kind: Kind, payload: &serde_json::Value) -> Result<(), PublishError> {
        let odd = extensions::nonconforming_keys(kind, payload);
        if odd.is_empty() {
            return Ok(());
        }
        let inner = &*self.inner;
        inner
            .shared
            .metrics
            .publisher_nonconforming_keys
            .inc_by(odd.len() as u64);
        let new = inner.reported.first_seen(kind, &odd);
        if !new.is_empty() {
            info!(%kind, keys = %new.join(", "), "payload keys neither in the spec nor x_<org>_<field> (logged once per key)");
        }
        if !inner.config.refuse_nonconforming_keys {
            return Ok(());
        }
        Err(PublishError::Nonconforming {
            kind,
            keys: odd.join(", "),
        })
    }

    /// Validate, stamp, encode and send one event. Returns at once; the [`Receipt`] resolves
    /// when the event is durable. An invalid event is an error here and is never published.
    /// Top-level payload keys neither defined by the kind nor of the `x_<org>_<field>` shape
    /// are counted (`weft_publisher_nonconforming_keys_total`) and logged, and refused
    /// (`nonconforming_key`) when `refuse_nonconforming_keys` is set.
    pub fn publish(&self, env: Envelope) -> Result<Receipt, PublishError> {
        self.publish_with(env, true)
    }

    /// [`Publisher::publish`]; `check_keys: false` for a caller that checked (and counted)
    /// the payload's keys itself (the gateway).
    pub(crate) fn publish_with(
        &self,
        mut env: Envelope,
        check_keys: bool,
    ) -> Result<Receipt, PublishError> {
        let started = Instant::now();
        let inner = &*self.inner;
        let (payload, identity) = env.validate()?;
        if check_keys {
            self.check_keys(env.kind, &payload)?;
        }
        if env.producer_id.is_none() {
            env.producer_id = Some(inner.producer_id.clone());
        }
        if env.seq.is_none() {
            env.seq = Some(inner.seq.fetch_add(1, Ordering::Relaxed) + 1);
        }
        if env.emitted_at.is_none() {
            env.emitted_at = Some(weft_schemas::time::now_rfc3339());
        }
        // JSON: the submitted text itself, lent to librdkafka (which copies it once).
        let encoded;
        let value: &[u8] = match inner.content_type {
            ContentType::Json => env.payload.get().as_bytes(),
            ct => {
                encoded = wire::encode_value_parsed(&env, &payload, ct, &inner.schema_ids)?;
                &encoded
            }
        };
        drop(payload);
        // Headers go straight into librdkafka's list; no String per header.
        let mut owned = Some(OwnedHeaders::new_with_capacity(7));
        let mut header_bytes = 0;
        wire::for_each_header(&env, inner.content_type, |k, v| {
            header_bytes += k.len() + v.len();
            owned = owned.take().map(|h| {
                h.insert(Header {
                    key: k,
                    value: Some(v),
                })
            });
        });
        let owned = owned.unwrap_or_else(|| OwnedHeaders::new_with_capacity(0));
        let key = env.request_id.as_deref().unwrap_or(&identity);
        let size = value.len() + key.len() + header_bytes;
        let max = inner.config.max_message_bytes;
        if size > max {
            return Err(PublishError::TooLarge { size, max });
        }
        let topic = &inner.topics[kind_index(env.kind)];
        let (reply, rx) = oneshot::channel();
        let sh = &*inner.shared;

        let mut st = sh.paced(lock(&sh.state), inner.config.message_timeout_ms);
        if st.closed {
            return Err(PublishError::Closed);
        }
        if !st.spooling {
            st.in_flight += 1;
            drop(st);
            let record =
                BaseRecord::with_opaque_to(topic, Box::new(Pending::Live { reply, started }))
                    .key(key.as_bytes())
                    .payload(value)
                    .headers(owned);
            let sent = match read(&sh.producer).as_ref() {
                Some(p) => p.send(record),
                None => Err((KafkaError::Canceled, record)),
            };
            let reply = match sent {
                Ok(()) => return Ok(Receipt { id: identity, rx }),
                Err((e, rec)) => match *rec.delivery_opaque {
                    Pending::Live { reply, .. } if !is_permanent(&e) => {
                        debug!(error = %e, "librdkafka refused the event; spooling it");
                        reply
                    }
                    _ => {
                        let mut st = lock(&sh.state);
                        st.in_flight -= 1;
                        sh.release_held(&mut st);
                        sh.maybe_resume_direct(&mut st);
                        return Err(PublishError::Kafka(e));
                    }
                },
            };
            // Queue full (or a transient client error): spool, ordered behind in-flight ones.
            let job = spool_job(topic, key, value, &env, inner.content_type, reply, started);
            let mut st = lock(&sh.state);
            st.in_flight -= 1;
            if !st.spooling {
                warn!("Kafka producer queue is full; spooling events");
                st.spooling = true;
            }
            if let Err(e) = sh.check_room(&st, job.size) {
                sh.release_held(&mut st);
                sh.maybe_resume_direct(&mut st);
                return Err(e);
            }
            sh.held_or_write(&mut st, job);
            drop(st);
            sh.changed.notify_all();
            return Ok(Receipt { id: identity, rx });
        }
        let job = spool_job(topic, key, value, &env, inner.content_type, reply, started);
        sh.check_room(&st, job.size)?;
        sh.held_or_write(&mut st, job);
        Ok(Receipt { id: identity, rx })
    }
}

/// A spool-bound job for an encoded event (the rare path: Kafka is not taking events).
pub(super) fn spool_job(
    topic: &str,
    key: &str,
    value: &[u8],
    env: &Envelope,
    content_type: ContentType,
    reply: Reply,
    started: Instant,
) -> Job {
    let record = SpoolRecord {
        topic: topic.to_owned(),
        key: Some(key.as_bytes().to_vec()),
        value: value.to_vec(),
        headers: wire::encode_headers(env, content_type)
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.into_bytes()))
            .collect(),
    };
    let size = Spool::size_of(std::slice::from_ref(&record));
    Job {
        record,
        size,
        reply: Some(reply),
        started,
    }
}
