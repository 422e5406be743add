//! The body of one spool record: a Kafka record (topic, key, value, headers) in a small
//! versioned binary layout, so a replay sends exactly the bytes the event was encoded to.

use super::SpoolError;

const BODY_VERSION: u8 = 1;

/// One Kafka record exactly as it will be produced: the spool stores the encoded record, so a
/// replay sends the very bytes the caller's event became.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpoolRecord {
    /// Kafka topic to produce to.
    pub topic: String,
    /// Record key (the partitioning key), if the record has one.
    pub key: Option<Vec<u8>>,
    /// Encoded record value.
    pub value: Vec<u8>,
    /// Kafka headers, name and value.
    pub headers: Vec<(String, Vec<u8>)>,
}

impl SpoolRecord {
    /// Bytes a record takes in a segment besides its topic, key, value and headers: the
    /// frame (length, CRC) and the body's version byte and lengths.
    pub const FIXED_BYTES: usize = super::FRAME as usize + 1 + 2 + 4 + 4 + 2;
    /// Bytes each header takes besides its name and value: their two lengths.
    pub const HEADER_BYTES: usize = 2 + 4;

    /// Encoded body length (what the spool bound counts, plus the `FRAME` header).
    pub fn encoded_len(&self) -> usize {
        Self::FIXED_BYTES - super::FRAME as usize
            + self.topic.len()
            + self.key.as_ref().map_or(0, Vec::len)
            + self.value.len()
            + self
                .headers
                .iter()
                .map(|(k, v)| Self::HEADER_BYTES + k.len() + v.len())
                .sum::<usize>()
    }

    /// Append the binary body to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.push(BODY_VERSION);
        out.extend((self.topic.len() as u16).to_le_bytes());
        out.extend(self.topic.as_bytes());
        match &self.key {
            Some(k) => {
                out.extend((k.len() as u32).to_le_bytes());
                out.extend(k);
            }
            None => out.extend(u32::MAX.to_le_bytes()),
        }
        out.extend((self.value.len() as u32).to_le_bytes());
        out.extend(&self.value);
        out.extend((self.headers.len() as u16).to_le_bytes());
        for (k, v) in &self.headers {
            out.extend((k.len() as u16).to_le_bytes());
            out.extend(k.as_bytes());
            out.extend((v.len() as u32).to_le_bytes());
            out.extend(v);
        }
    }

    /// Parse a body written by [`SpoolRecord::encode_into`].
    pub fn decode(mut b: &[u8]) -> Result<Self, SpoolError> {
        fn take<'a>(b: &mut &'a [u8], n: usize) -> Result<&'a [u8], SpoolError> {
            if b.len() < n {
                return Err(SpoolError::Corrupt("record body is truncated"));
            }
            let (h, t) = b.split_at(n);
            *b = t;
            Ok(h)
        }
        fn u16_(b: &mut &[u8]) -> Result<usize, SpoolError> {
            let s = take(b, 2)?;
            Ok(u16::from_le_bytes([s[0], s[1]]) as usize)
        }
        fn u32_(b: &mut &[u8]) -> Result<u32, SpoolError> {
            let s = take(b, 4)?;
            Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        }
        fn string(b: &mut &[u8], n: usize) -> Result<String, SpoolError> {
            String::from_utf8(take(b, n)?.to_vec())
                .map_err(|_| SpoolError::Corrupt("name is not UTF-8"))
        }
        if take(&mut b, 1)?[0] != BODY_VERSION {
            return Err(SpoolError::Corrupt("unknown record version"));
        }
        let n = u16_(&mut b)?;
        let topic = string(&mut b, n)?;
        let key = match u32_(&mut b)? {
            u32::MAX => None,
            n => Some(take(&mut b, n as usize)?.to_vec()),
        };
        let n = u32_(&mut b)? as usize;
        let value = take(&mut b, n)?.to_vec();
        let count = u16_(&mut b)?;
        let mut headers = Vec::with_capacity(count);
        for _ in 0..count {
            let n = u16_(&mut b)?;
            let name = string(&mut b, n)?;
            let n = u32_(&mut b)? as usize;
            headers.push((name, take(&mut b, n)?.to_vec()));
        }
        if !b.is_empty() {
            return Err(SpoolError::Corrupt("trailing bytes after record"));
        }
        Ok(Self {
            topic,
            key,
            value,
            headers,
        })
    }
}
