//! iSCSI PDUs (RFC 7143 section 11): the 48-byte basic header segment, additional header
//! segments, the data segment padded to 4 bytes, and the optional CRC32C header and data
//! digests; read from and written to a byte stream with every length checked.
//!
//! # Theory of operation
//! [`read_pdu`] reads one PDU: the header, then (when negotiated) its digest, then the AHS
//! and the data segment, refusing a data segment longer than the connection's limit
//! before reading it, so a peer cannot make the target allocate what it does not allow.
//! [`Pdu`] keeps the raw header and offers typed accessors for the fields the target
//! reads; the target's own PDUs are built with [`Pdu::new`] and the setters, and written
//! with [`write_pdu`], which fills in the lengths, the padding and the digests.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub const BHS_LEN: usize = 48;

// Initiator opcodes.
pub const OP_NOP_OUT: u8 = 0x00;
pub const OP_SCSI_CMD: u8 = 0x01;
pub const OP_TMF_REQ: u8 = 0x02;
pub const OP_LOGIN_REQ: u8 = 0x03;
pub const OP_TEXT_REQ: u8 = 0x04;
pub const OP_DATA_OUT: u8 = 0x05;
pub const OP_LOGOUT_REQ: u8 = 0x06;
pub const OP_SNACK: u8 = 0x10;
// Target opcodes.
pub const OP_NOP_IN: u8 = 0x20;
pub const OP_SCSI_RESP: u8 = 0x21;
pub const OP_TMF_RESP: u8 = 0x22;
pub const OP_LOGIN_RESP: u8 = 0x23;
pub const OP_TEXT_RESP: u8 = 0x24;
pub const OP_DATA_IN: u8 = 0x25;
pub const OP_LOGOUT_RESP: u8 = 0x26;
pub const OP_R2T: u8 = 0x31;
pub const OP_REJECT: u8 = 0x3f;

// Reject reasons (RFC 7143 11.17.1).
pub const REJECT_DATA_DIGEST: u8 = 0x02;
pub const REJECT_SNACK: u8 = 0x03;
pub const REJECT_PROTOCOL: u8 = 0x04;
pub const REJECT_NOT_SUPPORTED: u8 = 0x05;
pub const REJECT_INVALID_FIELD: u8 = 0x09;

/// The tag that means "no task" (reserved ITT, unused TTT).
pub const NO_TAG: u32 = 0xffff_ffff;

#[derive(Debug, thiserror::Error)]
pub enum PduError {
    #[error("connection closed")]
    Closed,
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("header digest mismatch")]
    HeaderDigest,
    /// The data segment failed its digest: the PDU is dropped (with a reject), the
    /// connection goes on.
    #[error("data digest mismatch")]
    DataDigest(Box<Pdu>),
    #[error("data segment of {got} bytes exceeds the negotiated {max}")]
    TooLong { got: usize, max: usize },
}

/// One PDU: the basic header (raw), the additional header segments and the data.
#[derive(Debug, Clone)]
pub struct Pdu {
    pub bhs: [u8; BHS_LEN],
    pub ahs: Vec<u8>,
    pub data: Vec<u8>,
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

impl Pdu {
    /// A target PDU of `opcode` with the final bit set, everything else zero.
    pub fn new(opcode: u8) -> Pdu {
        let mut bhs = [0u8; BHS_LEN];
        bhs[0] = opcode;
        bhs[1] = 0x80;
        Pdu {
            bhs,
            ahs: Vec::new(),
            data: Vec::new(),
        }
    }

    pub fn opcode(&self) -> u8 {
        self.bhs[0] & 0x3f
    }

    /// The immediate-delivery bit of an initiator PDU.
    pub fn immediate(&self) -> bool {
        self.bhs[0] & 0x40 != 0
    }

    pub fn flags(&self) -> u8 {
        self.bhs[1]
    }

    pub fn final_bit(&self) -> bool {
        self.bhs[1] & 0x80 != 0
    }

    /// The data segment length the header declares.
    pub fn data_len(&self) -> usize {
        (usize::from(self.bhs[5]) << 16)
            | (usize::from(self.bhs[6]) << 8)
            | usize::from(self.bhs[7])
    }

    pub fn ahs_len(&self) -> usize {
        usize::from(self.bhs[4]) * 4
    }

    pub fn lun_raw(&self) -> u64 {
        u64::from_be_bytes(self.bhs[8..16].try_into().expect("8 bytes"))
    }

    pub fn itt(&self) -> u32 {
        self.u32_at(16)
    }

    pub fn u32_at(&self, at: usize) -> u32 {
        be32(&self.bhs[at..at + 4])
    }

    pub fn u16_at(&self, at: usize) -> u16 {
        u16::from_be_bytes([self.bhs[at], self.bhs[at + 1]])
    }

    pub fn set_u32(&mut self, at: usize, v: u32) -> &mut Self {
        self.bhs[at..at + 4].copy_from_slice(&v.to_be_bytes());
        self
    }

    pub fn set_u16(&mut self, at: usize, v: u16) -> &mut Self {
        self.bhs[at..at + 2].copy_from_slice(&v.to_be_bytes());
        self
    }

    pub fn set_lun_raw(&mut self, lun: u64) -> &mut Self {
        self.bhs[8..16].copy_from_slice(&lun.to_be_bytes());
        self
    }

    pub fn set_itt(&mut self, itt: u32) -> &mut Self {
        self.set_u32(16, itt)
    }

    /// The sequence numbers every target PDU after login carries (StatSN at 24, ExpCmdSN at
    /// 28, MaxCmdSN at 32).
    pub fn set_sns(&mut self, stat_sn: u32, exp_cmd_sn: u32, max_cmd_sn: u32) -> &mut Self {
        self.set_u32(24, stat_sn)
            .set_u32(28, exp_cmd_sn)
            .set_u32(32, max_cmd_sn)
    }
}

/// Digests a connection uses, once negotiated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Digests {
    pub header: bool,
    pub data: bool,
}

fn pad4(n: usize) -> usize {
    (4 - n % 4) % 4
}

/// Reads one PDU; `max_data` bounds its data segment (our MaxRecvDataSegmentLength, or the
/// login limit).
pub async fn read_pdu<R: AsyncRead + Unpin>(
    r: &mut R,
    digests: Digests,
    max_data: usize,
) -> Result<Pdu, PduError> {
    let mut bhs = [0u8; BHS_LEN];
    match r.read_exact(&mut bhs).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(PduError::Closed),
        Err(e) => return Err(e.into()),
    }
    let mut pdu = Pdu {
        bhs,
        ahs: Vec::new(),
        data: Vec::new(),
    };
    let ahs_len = pdu.ahs_len();
    pdu.ahs = vec![0u8; ahs_len];
    r.read_exact(&mut pdu.ahs).await?;
    if digests.header {
        let mut d = [0u8; 4];
        r.read_exact(&mut d).await?;
        let mut crc = crc32c::crc32c(&pdu.bhs);
        crc = crc32c::crc32c_append(crc, &pdu.ahs);
        if crc != u32::from_le_bytes(d) {
            return Err(PduError::HeaderDigest);
        }
    }
    let len = pdu.data_len();
    if len > max_data {
        return Err(PduError::TooLong {
            got: len,
            max: max_data,
        });
    }
    if len > 0 {
        let mut data = read_segment(r, len + pad4(len)).await?;
        let mut bad = false;
        if digests.data {
            let mut d = [0u8; 4];
            r.read_exact(&mut d).await?;
            bad = crc32c::crc32c(&data) != u32::from_le_bytes(d);
        }
        data.truncate(len);
        pdu.data = data;
        if bad {
            return Err(PduError::DataDigest(Box::new(pdu)));
        }
    }
    Ok(pdu)
}

/// Reads exactly `n` bytes into a new buffer, without zero-filling it first: a write's data
/// (up to MaxRecvDataSegmentLength a PDU) is read once from the socket and never cleared.
async fn read_segment<R: AsyncRead + Unpin>(r: &mut R, n: usize) -> std::io::Result<Vec<u8>> {
    let mut data = Vec::with_capacity(n);
    while data.len() < n {
        let want = (n - data.len()) as u64;
        if (&mut *r).take(want).read_buf(&mut data).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(data)
}

/// Encodes a PDU with its lengths, padding and digests.
pub fn encode(pdu: &Pdu, digests: Digests) -> Vec<u8> {
    let mut bhs = pdu.bhs;
    bhs[4] = (pdu.ahs.len() / 4) as u8;
    let len = pdu.data.len();
    bhs[5] = (len >> 16) as u8;
    bhs[6] = (len >> 8) as u8;
    bhs[7] = len as u8;
    let mut out = Vec::with_capacity(BHS_LEN + pdu.ahs.len() + len + 12);
    out.extend_from_slice(&bhs);
    out.extend_from_slice(&pdu.ahs);
    if digests.header {
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
    }
    if len > 0 {
        let start = out.len();
        out.extend_from_slice(&pdu.data);
        out.resize(out.len() + pad4(len), 0);
        if digests.data {
            let crc = crc32c::crc32c(&out[start..]);
            out.extend_from_slice(&crc.to_le_bytes());
        }
    }
    out
}

pub async fn write_pdu<W: AsyncWrite + Unpin>(
    w: &mut W,
    pdu: &Pdu,
    digests: Digests,
) -> std::io::Result<()> {
    w.write_all(&encode(pdu, digests)).await
}

/// A Reject of `bad` for `reason` (RFC 7143 11.17), carrying the rejected header.
pub fn reject(bad: &[u8; BHS_LEN], reason: u8) -> Pdu {
    let mut p = Pdu::new(OP_REJECT);
    p.bhs[2] = reason;
    p.set_itt(NO_TAG);
    p.data = bad.to_vec();
    p
}

/// The LUN number in a single-level LUN structure (SAM-5 4.7: peripheral addressing for
/// 0-255, flat addressing above). None for a form the target does not use.
pub fn lun_number(raw: u64) -> Option<u16> {
    let b = raw.to_be_bytes();
    if b[2..].iter().any(|x| *x != 0) {
        return None;
    }
    match b[0] >> 6 {
        0 if b[0] == 0 => Some(u16::from(b[1])),
        1 => Some(u16::from(b[0] & 0x3f) << 8 | u16::from(b[1])),
        _ => None,
    }
}

/// The single-level LUN structure for LUN `n`.
pub fn lun_raw(n: u16) -> u64 {
    let b0 = if n < 256 { 0 } else { 0x40 | (n >> 8) as u8 };
    u64::from_be_bytes([b0, n as u8, 0, 0, 0, 0, 0, 0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pdus_round_trip_with_digests_and_padding() {
        let mut p = Pdu::new(OP_SCSI_RESP);
        p.set_itt(7).set_sns(1, 2, 3);
        p.data = vec![9; 5];
        for d in [
            Digests::default(),
            Digests {
                header: true,
                data: true,
            },
        ] {
            let wire = encode(&p, d);
            assert_eq!(wire.len() % 4, 0);
            let got = read_pdu(&mut wire.as_slice(), d, 1024).await.unwrap();
            assert_eq!(got.itt(), 7);
            assert_eq!(got.data, vec![9; 5]);
            assert_eq!(got.u32_at(32), 3);
        }
    }

    #[tokio::test]
    async fn bad_digests_and_lengths_are_refused() {
        let mut p = Pdu::new(OP_NOP_IN);
        p.data = vec![1; 100];
        let d = Digests {
            header: true,
            data: true,
        };
        let mut wire = encode(&p, d);
        wire[10] ^= 1;
        assert!(matches!(
            read_pdu(&mut wire.as_slice(), d, 1024).await,
            Err(PduError::HeaderDigest)
        ));
        let mut wire = encode(&p, d);
        wire[60] ^= 1;
        assert!(matches!(
            read_pdu(&mut wire.as_slice(), d, 1024).await,
            Err(PduError::DataDigest(_))
        ));
        let wire = encode(&p, Digests::default());
        assert!(matches!(
            read_pdu(&mut wire.as_slice(), Digests::default(), 64).await,
            Err(PduError::TooLong { got: 100, max: 64 })
        ));
        // Cut short: an error, never a panic.
        for cut in 0..wire.len() {
            assert!(read_pdu(&mut &wire[..cut], Digests::default(), 1024)
                .await
                .is_err());
        }
    }

    #[test]
    fn luns_use_peripheral_and_flat_addressing() {
        for n in [0u16, 1, 255, 256, 4000] {
            assert_eq!(lun_number(lun_raw(n)), Some(n));
        }
        assert_eq!(lun_number(0x0001_0000_0000_0000), Some(1));
        assert_eq!(lun_number(0x8001_0000_0000_0000), None);
        assert_eq!(lun_number(0x0001_0001_0000_0000), None);
    }
}
