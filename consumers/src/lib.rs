//! `weft-consumers`: the storage side of weft.
//!
//! - [`store`]: ClickHouse connection settings, the migration runner (`weft migrate`) and
//!   shared query helpers that the router and the audit tools reuse.

pub mod store;
