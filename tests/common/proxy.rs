//! A TCP proxy in front of ClickHouse's HTTP port that spoils one insert, for fault tests.
//!
//! It forwards every request and every reply as they are, one exchange at a time per
//! connection (HTTP/1.1 keep-alive: it reads each message's framing, `Content-Length` or
//! chunked, to know where it ends), except the first request that inserts into the chosen
//! table. The clickhouse crate sends an insert as a POST whose `query` URL parameter is the
//! SQL (`INSERT INTO t FORMAT Native`) and whose chunked body is the data, so the request
//! head alone names the insert. That request meets a [`Fault`], and the connection ends.
//!
//! The proxy runs on a runtime of its own, in a thread of its own, so that a test blocked
//! in a `std::process::Command` never stalls it.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{
    AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader,
};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

/// What happens to the insert the proxy spoils.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The whole request reaches ClickHouse and its whole reply is read (the insert has
    /// landed), then the client's connection is closed without that reply.
    LoseReply,
    /// The head and half of the first body chunk reach ClickHouse, then both connections
    /// are closed: the insert's data block is cut short, so nothing of it can land.
    CutRequest,
}

struct State {
    table: String,
    fault: Fault,
    /// Inserts spoiled so far (the proxy spoils one).
    hits: AtomicU32,
    /// The spoiled request's target (path and query string).
    target: Mutex<Option<String>>,
    /// With [`Fault::LoseReply`]: the status line of the reply ClickHouse gave and the
    /// client never saw.
    lost_status: Mutex<Option<String>>,
}

/// A running proxy; it stops (every connection with it) when dropped.
pub struct Proxy {
    /// `http://127.0.0.1:PORT`, to give as the ClickHouse URL.
    pub url: String,
    state: Arc<State>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// A proxy to the ClickHouse at `upstream` (an `http://host:port` URL) that spoils the
    /// first insert into `table` with `fault`.
    pub fn start(upstream: &str, table: &str, fault: Fault) -> Proxy {
        let authority = upstream
            .strip_prefix("http://")
            .expect("the ClickHouse URL is http://host:port")
            .trim_end_matches('/');
        let upstream: SocketAddr = std::net::ToSocketAddrs::to_socket_addrs(authority)
            .expect("resolve the ClickHouse address")
            .next()
            .expect("the ClickHouse address resolves");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let url = format!("http://{}", listener.local_addr().expect("proxy address"));
        let state = Arc::new(State {
            table: table.to_owned(),
            fault,
            hits: AtomicU32::new(0),
            target: Mutex::new(None),
            lost_status: Mutex::new(None),
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let st = state.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("proxy runtime");
            rt.block_on(async move {
                let listener = TcpListener::from_std(listener).expect("tokio listener");
                let accept = async {
                    loop {
                        let client = match listener.accept().await {
                            Ok((client, _)) => client,
                            Err(e) => {
                                // Ingest then cannot reach ClickHouse, and the test fails.
                                eprintln!("proxy: accept failed, no more connections: {e}");
                                return;
                            }
                        };
                        let st = st.clone();
                        tokio::spawn(async move {
                            // A connection's error ends that connection only; the client
                            // sees it closed, as it would with a real network fault.
                            let _ = serve(client, upstream, st).await;
                        });
                    }
                };
                tokio::select! {
                    _ = accept => {}
                    _ = stopped => {}
                }
            });
            // Dropping the runtime here ends every connection task.
        });
        Proxy {
            url,
            state,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// How many inserts the proxy has spoiled (0 or 1).
    pub fn hits(&self) -> u32 {
        self.state.hits.load(Ordering::SeqCst)
    }

    /// The spoiled request's target (path and query string), once there is one.
    pub fn target(&self) -> Option<String> {
        self.state.target.lock().expect("proxy state").clone()
    }

    /// With [`Fault::LoseReply`]: the status line of the reply ClickHouse gave to the
    /// spoiled insert, which its client never received.
    pub fn lost_status(&self) -> Option<String> {
        self.state.lost_status.lock().expect("proxy state").clone()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How a message's body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    None,
    Length(u64),
    Chunked,
    /// A reply with neither a length nor chunks: it ends when the server closes.
    UntilClose,
}

/// A message head: its first line, its headers (names in lower case) and its raw bytes.
struct Head {
    raw: Vec<u8>,
    first: String,
    headers: Vec<(String, String)>,
}

impl Head {
    fn parse(raw: Vec<u8>) -> io::Result<Head> {
        let text = String::from_utf8_lossy(&raw).into_owned();
        let mut lines = text.split("\r\n");
        let first = lines.next().unwrap_or_default().to_owned();
        let mut headers = Vec::new();
        for line in lines.filter(|l| !l.is_empty()) {
            let (name, value) = line
                .split_once(':')
                .ok_or_else(|| bad(format!("header line without a colon: {line:?}")))?;
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
        Ok(Head {
            raw,
            first,
            headers,
        })
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body's framing when the message has one; `otherwise` when it says nothing.
    fn body(&self, otherwise: Body) -> io::Result<Body> {
        if let Some(te) = self.header("transfer-encoding") {
            if te.to_ascii_lowercase().contains("chunked") {
                return Ok(Body::Chunked);
            }
        }
        match self.header("content-length") {
            Some(n) => n
                .parse()
                .map(Body::Length)
                .map_err(|_| bad(format!("Content-Length {n:?}"))),
            None => Ok(otherwise),
        }
    }

    fn says_close(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }

    /// The request line's method and target.
    fn method_target(&self) -> (&str, &str) {
        let mut words = self.first.split(' ');
        (
            words.next().unwrap_or_default(),
            words.next().unwrap_or_default(),
        )
    }

    /// The reply's status code.
    fn status(&self) -> u16 {
        self.first
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Whether a request target's `query` parameter is `INSERT INTO <table> ...`.
fn inserts_into(target: &str, table: &str) -> bool {
    let Some((_, query_string)) = target.split_once('?') else {
        return false;
    };
    query_string
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .filter(|(name, _)| *name == "query")
        .any(|(_, sql)| {
            let sql = form_decode(sql);
            let mut words = sql.split_whitespace();
            let (insert, into, name) = (words.next(), words.next(), words.next());
            insert.is_some_and(|w| w.eq_ignore_ascii_case("insert"))
                && into.is_some_and(|w| w.eq_ignore_ascii_case("into"))
                && name.is_some_and(|n| {
                    let n = n.split('(').next().unwrap_or_default().trim_matches('`');
                    n == table || n.ends_with(&format!(".{table}"))
                })
        })
}

/// `application/x-www-form-urlencoded` decoding: `+` is a space, `%XX` a byte.
fn form_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'+', _) => out.push(b' '),
            (b'%', Some(v)) => {
                out.push(v);
                i += 2;
            }
            (c, _) => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A message head, up to and with its empty line; `None` when the peer closed before one.
async fn read_head<R: AsyncBufRead + Unpin>(r: &mut R) -> io::Result<Option<Head>> {
    let mut raw = Vec::new();
    loop {
        let start = raw.len();
        if r.read_until(b'\n', &mut raw).await? == 0 {
            if raw.is_empty() {
                return Ok(None);
            }
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        if raw.len() > 1 << 20 {
            return Err(bad("message head over 1 MiB".into()));
        }
        if &raw[start..] == b"\r\n" || &raw[start..] == b"\n" {
            return Head::parse(raw).map(Some);
        }
    }
}

/// Copy exactly `n` bytes from `r` to `w`.
async fn copy_exact<R, W>(r: &mut R, w: &mut W, n: u64) -> io::Result<()>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let copied = tokio::io::copy_buf(&mut r.take(n), w).await?;
    if copied < n {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

/// Read one line (with its line end) from `r`, refusing an end of stream.
async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    if r.read_until(b'\n', &mut line).await? == 0 || !line.ends_with(b"\n") {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(line)
}

/// The size a chunk-size line announces.
fn chunk_size(line: &[u8]) -> io::Result<u64> {
    let text = String::from_utf8_lossy(line);
    let hex = text.split(';').next().unwrap_or_default().trim();
    u64::from_str_radix(hex, 16).map_err(|_| bad(format!("chunk size {hex:?}")))
}

/// Copy one message body framed as `body` from `r` to `w`, byte for byte.
async fn copy_body<R, W>(r: &mut R, w: &mut W, body: Body) -> io::Result<()>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    match body {
        Body::None => {}
        Body::Length(n) => copy_exact(r, w, n).await?,
        Body::UntilClose => {
            tokio::io::copy_buf(r, w).await?;
        }
        Body::Chunked => loop {
            let line = read_line(r).await?;
            w.write_all(&line).await?;
            let size = chunk_size(&line)?;
            if size == 0 {
                // Trailers, up to and with the empty line.
                loop {
                    let line = read_line(r).await?;
                    w.write_all(&line).await?;
                    if line == b"\r\n" || line == b"\n" {
                        break;
                    }
                }
                break;
            }
            // The data and its CRLF.
            copy_exact(r, w, size + 2).await?;
        },
    }
    w.flush().await
}

/// Forward one reply (after any interim 1xx replies) from `r` to `w`, for a request with
/// method `method`: its status line, and whether the connection may carry another exchange.
async fn forward_reply<R, W>(r: &mut R, w: &mut W, method: &str) -> io::Result<(String, bool)>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    loop {
        let head = read_head(r)
            .await?
            .ok_or(io::Error::from(io::ErrorKind::UnexpectedEof))?;
        w.write_all(&head.raw).await?;
        let status = head.status();
        if (100..200).contains(&status) {
            continue;
        }
        let body = if method == "HEAD" || status == 204 || status == 304 {
            Body::None
        } else {
            head.body(Body::UntilClose)?
        };
        copy_body(r, w, body).await?;
        let keep_alive = body != Body::UntilClose && !head.says_close();
        return Ok((head.first, keep_alive));
    }
}

/// One client connection: exchanges forwarded one at a time until either side closes, or
/// the request to spoil comes, which ends it.
async fn serve(client: TcpStream, upstream: SocketAddr, st: Arc<State>) -> io::Result<()> {
    let server = TcpStream::connect(upstream).await?;
    let (cr, mut cw) = client.into_split();
    let (sr, mut sw) = server.into_split();
    let (mut cr, mut sr) = (BufReader::new(cr), BufReader::new(sr));
    loop {
        let Some(req) = read_head(&mut cr).await? else {
            return Ok(());
        };
        let (method, target) = req.method_target();
        let method = method.to_owned();
        let body = req.body(Body::None)?;
        let spoil = inserts_into(target, &st.table)
            && st
                .hits
                .compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok();
        sw.write_all(&req.raw).await?;
        if spoil {
            *st.target.lock().expect("proxy state") = Some(target.to_owned());
            return spoil_insert(&mut cr, &mut sw, &mut sr, body, &method, &st).await;
        }
        // The request's body goes up while the reply comes down (a server may answer
        // before it has read the whole body).
        let (up, down) = tokio::join!(
            copy_body(&mut cr, &mut sw, body),
            forward_reply(&mut sr, &mut cw, &method)
        );
        up?;
        let (_, keep_alive) = down?;
        if !keep_alive || req.says_close() {
            return Ok(());
        }
    }
}

/// The spoiled request, its head already sent upstream. Returning drops both connections.
async fn spoil_insert(
    cr: &mut BufReader<OwnedReadHalf>,
    sw: &mut OwnedWriteHalf,
    sr: &mut BufReader<OwnedReadHalf>,
    body: Body,
    method: &str,
    st: &State,
) -> io::Result<()> {
    match st.fault {
        Fault::LoseReply => {
            copy_body(cr, sw, body).await?;
            // ClickHouse's whole reply, read (the insert has finished) and dropped.
            let (status, _) = forward_reply(sr, &mut tokio::io::sink(), method).await?;
            *st.lost_status.lock().expect("proxy state") = Some(status);
        }
        Fault::CutRequest => match body {
            Body::Length(n) => copy_exact(cr, sw, n / 2).await?,
            Body::Chunked => {
                let line = read_line(cr).await?;
                sw.write_all(&line).await?;
                copy_exact(cr, sw, chunk_size(&line)? / 2).await?;
            }
            Body::None | Body::UntilClose => {
                return Err(bad("an insert without a body to cut".into()));
            }
        },
    }
    sw.flush().await
}
