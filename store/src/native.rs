//! Inserts in ClickHouse's Native format, for the tables written once per event.
//!
//! **Why.** RowBinary is parsed row by row: ClickHouse deserializes each value of each row
//! into its column. Native is columnar: each column arrives whole and is appended at once.
//! The same 20,000-row batches of `weft_events` (1M events from `weft bench ingest`, sent
//! over HTTP in turn on one server) cost ClickHouse 106 ms of CPU each as RowBinary and 68 ms
//! as Native (docs/BENCHMARKS.md, session 13). The client's work is the same: one pass over
//! the rows per column instead of one pass over the columns per row.
//!
//! **Why not the `clickhouse` crate's own Native writer.** It has no `DateTime64` value and it
//! sends every string of 128 bytes or more (every payload) as a body chunk of its own. This
//! encoder writes one block per insert into one buffer, with the handful of wire types weft's
//! tables use: strings, fixed-width little-endian values, and arrays of strings or of string
//! tuples. Low-cardinality columns go as `String`; ClickHouse converts them on insert
//! (`input_format_native_allow_types_conversion`, on by default).
//!
//! **One insert, one block, one part.** A block is inserted whole or not at all, as a
//! RowBinary insert of the same rows was: exactly-once ingest relies on it.
//!
//! A row type lists its columns once, in [`NativeRows::write`], in the order of its
//! `clickhouse::Row` field list; [`insert_native`] checks the two agree before sending.

use bytes::{BufMut, Bytes, BytesMut};
use clickhouse::Row;
use weft_schemas::links::Link;

use crate::events::EventRow;
use crate::narrative::{LinkRow, NarrativeRow, NodeRow};
use crate::{Store, StoreError};

/// The column type weft sends for its `DateTime64(6, 'UTC')` columns (micros since the epoch).
const MICROS: &str = "DateTime64(6, 'UTC')";

/// Bytes handed to the HTTP body at a time (the client compresses each chunk on its own when
/// compression is on).
const CHUNK: usize = 1 << 20;

/// Rows that can be written as one Native block.
pub trait NativeRows: Row + Sized {
    /// Write every column of `rows`, in the order of `Self::COLUMN_NAMES`.
    fn write(block: &mut Block<'_, Self>);

    /// About how many bytes the row takes in a block, erring high, so that the block's buffer
    /// is allocated once: grown by doubling, it copied the batch's body again at each step
    /// (a profile showed it, though removing it changed no measured total beyond noise).
    fn size_hint(&self) -> usize;
}

/// One Native block being written: its header, then its columns in turn.
pub struct Block<'r, R> {
    rows: &'r [R],
    buf: BytesMut,
    /// The columns written so far, checked against `R::COLUMN_NAMES` when the block ends.
    names: Vec<&'static str>,
}

impl<'r, R: NativeRows> Block<'r, R> {
    fn new(rows: &'r [R], capacity: usize) -> Self {
        let mut buf = BytesMut::with_capacity(capacity);
        put_varuint(&mut buf, R::COLUMN_NAMES.len() as u64);
        put_varuint(&mut buf, rows.len() as u64);
        Self {
            rows,
            buf,
            names: Vec::with_capacity(R::COLUMN_NAMES.len()),
        }
    }

    fn header(&mut self, name: &'static str, ty: &str) {
        self.names.push(name);
        put_str(&mut self.buf, name);
        put_str(&mut self.buf, ty);
    }

    /// A `String` column (also for `LowCardinality(String)` columns: ClickHouse converts).
    pub fn str(&mut self, name: &'static str, value: impl Fn(&R) -> &str) {
        self.header(name, "String");
        for r in self.rows {
            put_str(&mut self.buf, value(r));
        }
    }

    /// A `FixedString(N)` column.
    pub fn fixed<const N: usize>(&mut self, name: &'static str, value: impl Fn(&R) -> &[u8; N]) {
        self.header(name, &format!("FixedString({N})"));
        for r in self.rows {
            self.buf.put_slice(value(r));
        }
    }

    /// A `UInt8` column.
    pub fn u8(&mut self, name: &'static str, value: impl Fn(&R) -> u8) {
        self.header(name, "UInt8");
        for r in self.rows {
            self.buf.put_u8(value(r));
        }
    }

    /// A `UInt32` column.
    pub fn u32(&mut self, name: &'static str, value: impl Fn(&R) -> u32) {
        self.header(name, "UInt32");
        for r in self.rows {
            self.buf.put_u32_le(value(r));
        }
    }

    /// A `UInt64` column.
    pub fn u64(&mut self, name: &'static str, value: impl Fn(&R) -> u64) {
        self.header(name, "UInt64");
        for r in self.rows {
            self.buf.put_u64_le(value(r));
        }
    }

    /// A `DateTime64(6, 'UTC')` column, from micros since the epoch.
    pub fn micros(&mut self, name: &'static str, value: impl Fn(&R) -> i64) {
        self.header(name, MICROS);
        for r in self.rows {
            self.buf.put_i64_le(value(r));
        }
    }

    /// An `Array(String)` column: the running end offset of each row's array, then every
    /// element.
    pub fn str_array(&mut self, name: &'static str, value: impl Fn(&R) -> &[Box<str>]) {
        self.header(name, "Array(String)");
        self.offsets(|r| value(r).len());
        for r in self.rows {
            for s in value(r) {
                put_str(&mut self.buf, s);
            }
        }
    }

    /// An `Array(Tuple(String, String, String))` column of links (via, target kind, target
    /// id): the end offsets, then each element of the tuples as a column of its own.
    pub fn link_array(&mut self, name: &'static str, value: impl Fn(&R) -> &[Link]) {
        self.header(name, "Array(Tuple(String, String, String))");
        self.offsets(|r| value(r).len());
        let elements: [fn(&Link) -> &str; 3] =
            [|l| l.via.as_str(), |l| l.to_kind.as_str(), |l| &l.to_id];
        for element in elements {
            for r in self.rows {
                for l in value(r) {
                    put_str(&mut self.buf, element(l));
                }
            }
        }
    }

    fn offsets(&mut self, len: impl Fn(&R) -> usize) {
        let mut end = 0u64;
        for r in self.rows {
            end += len(r) as u64;
            self.buf.put_u64_le(end);
        }
    }

    /// The block's bytes, once its columns are those of `R`'s field list.
    fn finish(self) -> Result<Bytes, String> {
        if self.names != R::COLUMN_NAMES {
            return Err(format!(
                "wrote columns {:?}, the row type has {:?}",
                self.names,
                R::COLUMN_NAMES
            ));
        }
        Ok(self.buf.freeze())
    }
}

/// The buffer a block of `rows` is given: its header (a column's name and type take under
/// 64 bytes) and every row's hint.
fn capacity<R: NativeRows>(rows: &[R]) -> usize {
    64 * R::COLUMN_NAMES.len() + rows.iter().map(R::size_hint).sum::<usize>()
}

/// Encode `rows` as one Native block.
pub fn encode<R: NativeRows>(rows: &[R]) -> Result<Bytes, String> {
    let mut block = Block::new(rows, capacity(rows));
    R::write(&mut block);
    block.finish()
}

/// Insert `rows` into `table` (one of weft's own table names: it is formatted into the
/// statement) as one Native block, in one statement (no-op when empty).
pub async fn insert_native<R: NativeRows>(
    store: &Store,
    table: &str,
    rows: &[R],
) -> Result<(), StoreError> {
    insert_native_as(store, table, rows, None).await
}

/// [`insert_native`], run as `query_id` when given (unique per attempt: ClickHouse refuses a
/// second query with the id of one still running). While the insert runs, ClickHouse lists
/// it under that id in `system.processes`, so a caller whose answer was lost can wait until
/// it no longer runs ([`Store::wait_for_query`]) before asking what it stored.
pub async fn insert_native_as<R: NativeRows>(
    store: &Store,
    table: &str,
    rows: &[R],
    query_id: Option<&str>,
) -> Result<(), StoreError> {
    if rows.is_empty() {
        return Ok(());
    }
    let mut body = encode(rows).map_err(|detail| StoreError::Encode {
        table: table.to_owned(),
        detail,
    })?;
    let mut ins = store
        .client()
        .insert_formatted_with(format!("INSERT INTO {table} FORMAT Native"));
    if let Some(id) = query_id {
        ins = ins.with_setting("query_id", id);
    }
    // The body goes out from a task of its own: streamed from the caller's task, each chunk
    // waited there for the caller to be polled again, and a caller that computes meanwhile
    // (the flush runs the facts insert beside the narrative pass) held ClickHouse's insert
    // back by that long. Dropping the caller still cancels the insert.
    let mut send = AbortOnDrop(tokio::spawn(async move {
        while !body.is_empty() {
            let chunk = body.split_to(body.len().min(CHUNK));
            ins.send(chunk).await?;
        }
        ins.end().await
    }));
    match (&mut send.0).await {
        Ok(sent) => sent.map_err(store.err()),
        // Only a panic: the task is aborted only when this future is dropped.
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// A task aborted when its handle is dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn put_varuint(buf: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        buf.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    buf.put_u8(v as u8);
}

fn put_str(buf: &mut BytesMut, s: &str) {
    put_varuint(buf, s.len() as u64);
    buf.put_slice(s.as_bytes());
}

impl NativeRows for EventRow<'_> {
    fn write(b: &mut Block<'_, Self>) {
        b.str("tenant", |r| r.tenant);
        b.str("kind", |r| r.kind);
        b.str("id", |r| r.id);
        b.fixed("content_hash", |r| &r.content_hash);
        b.micros("ts", |r| r.ts);
        b.str("request_id", |r| r.request_id);
        b.str("producer_id", |r| r.producer_id);
        b.u64("seq", |r| r.seq);
        b.micros("emitted_at", |r| r.emitted_at);
        b.micros("ingested_at", |r| r.ingested_at);
        b.str("event_type", |r| r.event_type);
        b.str("principal", |r| r.principal);
        b.str("capability_id", |r| r.capability_id);
        b.str("decision", |r| r.decision);
        b.str("outcome", |r| r.outcome);
        b.str("token_id", |r| r.token_id);
        b.str("decision_id", |r| r.decision_id);
        b.str("frame_id", |r| r.frame_id);
        b.str("handle_id", |r| r.handle_id);
        b.str_array("handle_refs", |r| r.handle_refs);
        b.str("candidate_id", |r| r.candidate_id);
        b.str("flow_id", |r| r.flow_id);
        b.link_array("links", |r| r.links);
        b.u8("conflict", |r| r.conflict);
        b.str("topic", |r| r.topic);
        b.u32("partition", |r| r.partition);
        b.u64("offset", |r| r.offset);
        b.str("content_type", |r| r.content_type);
        b.str("payload", |r| r.payload);
    }

    fn size_hint(&self) -> usize {
        let refs: usize = self.handle_refs.iter().map(|s| s.len() + 1).sum();
        let links: usize = self.links.iter().map(|l| l.to_id.len() + 48).sum();
        self.payload.len() + 3 * self.id.len() + refs + links + 512
    }
}

impl<S: AsRef<str>> NativeRows for NarrativeRow<S> {
    fn write(b: &mut Block<'_, Self>) {
        b.str("tenant", |r| r.tenant.as_ref());
        b.str("narrative_id", |r| r.narrative_id.as_ref());
        b.str("kind", |r| r.kind.as_ref());
        b.str("id", |r| r.id.as_ref());
        b.fixed("content_hash", |r| &r.content_hash);
        b.micros("ts", |r| r.ts);
        b.str("request_id", |r| r.request_id.as_ref());
        b.str("payload", |r| r.payload.as_ref());
        b.u64("version", |r| r.version);
        b.u8("is_deleted", |r| r.is_deleted);
    }

    fn size_hint(&self) -> usize {
        let len = |s: &S| s.as_ref().len();
        len(&self.payload) + len(&self.narrative_id) + len(&self.id) + 128
    }
}

impl<S: AsRef<str>> NativeRows for NodeRow<S> {
    fn write(b: &mut Block<'_, Self>) {
        b.str("tenant", |r| r.tenant.as_ref());
        b.str("kind", |r| r.kind.as_ref());
        b.str("id", |r| r.id.as_ref());
        b.str("narrative_id", |r| r.narrative_id.as_ref());
        b.str("request_id", |r| r.request_id.as_ref());
        b.micros("ts", |r| r.ts);
        b.u64("version", |r| r.version);
    }

    fn size_hint(&self) -> usize {
        let len = |s: &S| s.as_ref().len();
        len(&self.id) + len(&self.narrative_id) + len(&self.request_id) + 96
    }
}

impl<S: AsRef<str>> NativeRows for LinkRow<S> {
    fn write(b: &mut Block<'_, Self>) {
        b.str("tenant", |r| r.tenant.as_ref());
        b.str("to_kind", |r| r.to_kind.as_ref());
        b.str("to_id", |r| r.to_id.as_ref());
        b.str("from_kind", |r| r.from_kind.as_ref());
        b.str("from_id", |r| r.from_id.as_ref());
        b.str("via", |r| r.via.as_ref());
    }

    fn size_hint(&self) -> usize {
        self.to_id.as_ref().len() + self.from_id.as_ref().len() + 96
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ddl;
    use serde::Serialize;
    use weft_schemas::links::{NodeKind, Via};
    use weft_schemas::Kind;

    fn varuint(b: &mut &[u8]) -> u64 {
        let (mut v, mut shift) = (0u64, 0);
        loop {
            let byte = b[0];
            *b = &b[1..];
            v |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return v;
            }
            shift += 7;
        }
    }

    fn string(b: &mut &[u8]) -> String {
        let n = varuint(b) as usize;
        let s = String::from_utf8(b[..n].to_vec()).unwrap();
        *b = &b[n..];
        s
    }

    fn take<const N: usize>(b: &mut &[u8]) -> [u8; N] {
        let v: [u8; N] = b[..N].try_into().unwrap();
        *b = &b[N..];
        v
    }

    fn node(id: &str, ts: i64) -> NodeRow {
        NodeRow {
            tenant: "acme".into(),
            kind: "frame".into(),
            id: id.into(),
            narrative_id: "req-1".into(),
            request_id: String::new(),
            ts,
            version: 7,
        }
    }

    #[test]
    fn a_block_is_laid_out_column_by_column() {
        let rows = [node("f-1", 1_000_000), node("f-22", -5)];
        let bytes = encode(&rows).unwrap();
        let mut b = &bytes[..];
        assert_eq!((varuint(&mut b), varuint(&mut b)), (7, 2), "columns, rows");
        for (name, values) in [
            ("tenant", ["acme", "acme"]),
            ("kind", ["frame", "frame"]),
            ("id", ["f-1", "f-22"]),
            ("narrative_id", ["req-1", "req-1"]),
            ("request_id", ["", ""]),
        ] {
            assert_eq!(
                (string(&mut b), string(&mut b)),
                (name.into(), "String".into())
            );
            assert_eq!([string(&mut b), string(&mut b)], values.map(String::from));
        }
        assert_eq!(
            (string(&mut b), string(&mut b)),
            ("ts".into(), MICROS.into())
        );
        assert_eq!(i64::from_le_bytes(take(&mut b)), 1_000_000);
        assert_eq!(i64::from_le_bytes(take(&mut b)), -5);
        assert_eq!(
            (string(&mut b), string(&mut b)),
            ("version".into(), "UInt64".into())
        );
        assert_eq!(u64::from_le_bytes(take(&mut b)), 7);
        assert_eq!(u64::from_le_bytes(take(&mut b)), 7);
        assert!(b.is_empty(), "{} bytes left over", b.len());
    }

    fn link(via: Via, kind: Kind, id: &str) -> Link {
        Link {
            via,
            to_kind: NodeKind::Event(kind),
            to_id: id.into(),
        }
    }

    fn event<'a>(refs: &'a [Box<str>], links: &'a [Link]) -> EventRow<'a> {
        EventRow {
            tenant: "acme",
            kind: "frame",
            id: "f-1",
            content_hash: [0xab; 32],
            ts: 1,
            request_id: "req-1",
            producer_id: "p",
            seq: 2,
            emitted_at: 3,
            ingested_at: 4,
            event_type: "",
            principal: "",
            capability_id: "cap",
            decision: "",
            outcome: "",
            token_id: "",
            decision_id: "",
            frame_id: "f-1",
            handle_id: "",
            handle_refs: refs,
            candidate_id: "",
            flow_id: "",
            links,
            conflict: 0,
            topic: "t",
            partition: 5,
            offset: 6,
            content_type: "application/json",
            payload: "{}",
        }
    }

    #[test]
    fn arrays_send_end_offsets_then_their_elements() {
        let refs: [Box<str>; 2] = ["h-1".into(), "h-2".into()];
        let links = [link(Via::HandleRefs, Kind::Handle, "h-1")];
        let rows = [
            event(&refs, &links),
            event(&[], &[]),
            event(&refs[1..], &links),
        ];
        let bytes = encode(&rows).unwrap();
        let mut b = &bytes[..];
        varuint(&mut b);
        varuint(&mut b);
        // Skip to handle_refs: every column before it is read as its header says.
        loop {
            let (name, ty) = (string(&mut b), string(&mut b));
            if name == "handle_refs" {
                assert_eq!(ty, "Array(String)");
                break;
            }
            for _ in &rows {
                match ty.as_str() {
                    "String" => drop(string(&mut b)),
                    "FixedString(32)" => drop(take::<32>(&mut b)),
                    _ => drop(take::<8>(&mut b)),
                }
            }
        }
        let ends: Vec<u64> = (0..3).map(|_| u64::from_le_bytes(take(&mut b))).collect();
        assert_eq!(ends, [2, 2, 3]);
        let elems: Vec<String> = (0..3).map(|_| string(&mut b)).collect();
        assert_eq!(elems, ["h-1", "h-2", "h-2"]);
        assert_eq!(string(&mut b), "candidate_id");
        assert_eq!(string(&mut b), "String");
        (0..3).for_each(|_| drop(string(&mut b)));
        assert_eq!(string(&mut b), "flow_id");
        string(&mut b);
        (0..3).for_each(|_| drop(string(&mut b)));
        assert_eq!(
            (string(&mut b), string(&mut b)),
            (
                "links".into(),
                "Array(Tuple(String, String, String))".into()
            )
        );
        let ends: Vec<u64> = (0..3).map(|_| u64::from_le_bytes(take(&mut b))).collect();
        assert_eq!(ends, [1, 1, 2]);
        let parts: Vec<String> = (0..6).map(|_| string(&mut b)).collect();
        assert_eq!(
            parts,
            [
                "handle_refs",
                "handle_refs",
                "handle",
                "handle",
                "h-1",
                "h-1"
            ],
            "each tuple element as a column of its own"
        );
    }

    /// Every column a Native row type sends exists in its table, in the table's order of
    /// the row type's fields, with a type ClickHouse converts to the column's.
    #[test]
    fn every_native_row_matches_its_table() {
        let tables = ddl::tables(
            weft_schemas::migrations::all()
                .iter()
                .flat_map(|m| m.statements()),
        );
        let refs: [Box<str>; 1] = ["h".into()];
        let links = [link(Via::DecisionId, Kind::PolicyDecision, "i")];
        let link: LinkRow = LinkRow {
            tenant: "a".into(),
            to_kind: "b".into(),
            to_id: "c".into(),
            from_kind: "d".into(),
            from_id: "e".into(),
            via: "f".into(),
        };
        let member: NarrativeRow = NarrativeRow {
            tenant: "a".into(),
            narrative_id: "n".into(),
            kind: "k".into(),
            id: "i".into(),
            content_hash: [0; 32],
            ts: 0,
            request_id: String::new(),
            payload: "{}".into(),
            version: 1,
            is_deleted: 0,
        };
        // Never larger than the buffer it is given.
        fn enc<R: NativeRows>(rows: &[R]) -> Bytes {
            let bytes = encode(rows).unwrap();
            assert!(bytes.len() <= capacity(rows), "{} bytes", bytes.len());
            bytes
        }
        let blocks = [
            ("weft_events", enc(&[event(&refs, &links)])),
            ("weft_narratives", enc(&[member])),
            ("weft_narrative_nodes", enc(&[node("x", 0)])),
            ("weft_links", enc(std::slice::from_ref(&link))),
            ("weft_links_from", enc(&[link])),
        ];
        for (table, bytes) in blocks {
            let cols = &tables[table];
            let mut b = &bytes[..];
            let n = varuint(&mut b);
            assert_eq!(varuint(&mut b), 1);
            for _ in 0..n {
                let (name, sent) = (string(&mut b), string(&mut b));
                let col = cols
                    .iter()
                    .find(|c| c.name == name)
                    .unwrap_or_else(|| panic!("{table} has no column {name}"));
                let ty = col.definition.split(" CODEC").next().unwrap();
                let bare = ty
                    .strip_prefix("LowCardinality(")
                    .and_then(|t| t.strip_suffix(')'))
                    .unwrap_or(ty);
                let squeeze = |t: &str| t.replace(' ', "");
                assert_eq!(squeeze(&sent), squeeze(bare), "{table}.{name} is {ty}");
                // Past this column's data: one value, as its type says.
                match sent.as_str() {
                    "String" => drop(string(&mut b)),
                    "FixedString(32)" => drop(take::<32>(&mut b)),
                    "UInt8" => drop(take::<1>(&mut b)),
                    "UInt32" => drop(take::<4>(&mut b)),
                    "Array(String)" => {
                        assert_eq!(u64::from_le_bytes(take(&mut b)), 1);
                        string(&mut b);
                    }
                    "Array(Tuple(String, String, String))" => {
                        assert_eq!(u64::from_le_bytes(take(&mut b)), 1);
                        (0..3).for_each(|_| drop(string(&mut b)));
                    }
                    _ => drop(take::<8>(&mut b)),
                }
            }
            assert!(b.is_empty(), "{table}: {} bytes left over", b.len());
        }
    }

    #[derive(Row, Serialize)]
    struct Pair {
        a: String,
        b: u64,
    }

    impl NativeRows for Pair {
        fn write(b: &mut Block<'_, Self>) {
            b.u64("b", |r| r.b);
            b.str("a", |r| &r.a);
        }

        fn size_hint(&self) -> usize {
            0
        }
    }

    #[test]
    fn columns_out_of_the_row_types_order_are_refused() {
        let err = encode(&[Pair {
            a: "x".into(),
            b: 1,
        }])
        .unwrap_err();
        assert!(err.contains(r#"["b", "a"]"#), "{err}");
    }
}
