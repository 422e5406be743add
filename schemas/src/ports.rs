//! weft's default ports, in one place: every default address is loopback on one of these.
//! `deploy/local/stack.sh` starts its broker and ClickHouse on the first two (its
//! `WEFT_KAFKA_PORT` and `WEFT_CH_HTTP_PORT` move them).

use std::net::{Ipv4Addr, SocketAddr};

/// Kafka bootstrap port of the local stack (`[kafka] brokers`).
pub const KAFKA: u16 = 19092;
/// ClickHouse HTTP port of the local stack (`[clickhouse] url`).
pub const CLICKHOUSE_HTTP: u16 = 18123;
/// `weft gateway` (`[gateway] listen`).
pub const GATEWAY: u16 = 8787;
/// `weft ingest`'s status server (`[ingest] listen`).
pub const INGEST: u16 = 8788;
/// `weft router` (`--listen`, `[router] listen`).
pub const ROUTER: u16 = 8790;
/// `weft audit serve` (`--listen`, `[audit.serve] listen`).
pub const AUDIT: u16 = 8383;

/// `127.0.0.1:<port>`: where weft listens and connects unless told otherwise.
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_default_port_is_distinct_and_loopback() {
        let all = [KAFKA, CLICKHOUSE_HTTP, GATEWAY, INGEST, ROUTER, AUDIT];
        let set: std::collections::BTreeSet<u16> = all.into_iter().collect();
        assert_eq!(set.len(), all.len());
        assert_eq!(loopback(ROUTER).to_string(), "127.0.0.1:8790");
        assert!(loopback(GATEWAY).ip().is_loopback());
    }
}
