//! SCSI status codes and sense data (SPC-4 4.5): fixed format (0x70) by default, descriptor
//! format (0x72) when the initiator set D_SENSE in the control mode page.

pub const GOOD: u8 = 0x00;
pub const CHECK_CONDITION: u8 = 0x02;
pub const CONDITION_MET: u8 = 0x04;
pub const RESERVATION_CONFLICT: u8 = 0x18;

pub const NO_SENSE: u8 = 0x0;
pub const NOT_READY: u8 = 0x2;
pub const MEDIUM_ERROR: u8 = 0x3;
pub const HARDWARE_ERROR: u8 = 0x4;
pub const ILLEGAL_REQUEST: u8 = 0x5;
pub const UNIT_ATTENTION: u8 = 0x6;
pub const DATA_PROTECT: u8 = 0x7;
pub const COPY_ABORTED: u8 = 0xa;
pub const ABORTED_COMMAND: u8 = 0xb;
pub const MISCOMPARE: u8 = 0xe;

/// An additional sense code and qualifier.
pub type Asc = (u8, u8);

pub const INVALID_OPCODE: Asc = (0x20, 0x00);
pub const LBA_OUT_OF_RANGE: Asc = (0x21, 0x00);
pub const INVALID_FIELD_IN_CDB: Asc = (0x24, 0x00);
pub const LU_NOT_SUPPORTED: Asc = (0x25, 0x00);
pub const INVALID_FIELD_IN_PARAM: Asc = (0x26, 0x00);
pub const PARAM_LIST_LENGTH: Asc = (0x1a, 0x00);
pub const INVALID_FIELD_IN_IU: Asc = (0x0e, 0x03);
pub const WRITE_PROTECTED: Asc = (0x27, 0x00);
pub const SPACE_ALLOCATION_FAILED: Asc = (0x27, 0x07);
pub const UNRECOVERED_READ: Asc = (0x11, 0x00);
pub const WRITE_ERROR: Asc = (0x0c, 0x00);
pub const MISCOMPARE_DURING_VERIFY: Asc = (0x1d, 0x00);
pub const NOT_READY_CAUSE_NOT_REPORTABLE: Asc = (0x04, 0x00);
pub const SAVING_NOT_SUPPORTED: Asc = (0x39, 0x00);
pub const POWER_ON_RESET: Asc = (0x29, 0x00);
pub const BUS_DEVICE_RESET: Asc = (0x29, 0x03);
pub const MODE_PARAMETERS_CHANGED: Asc = (0x2a, 0x01);
pub const RESERVATIONS_PREEMPTED: Asc = (0x2a, 0x03);
pub const RESERVATIONS_RELEASED: Asc = (0x2a, 0x04);
pub const REGISTRATIONS_PREEMPTED: Asc = (0x2a, 0x05);
pub const CAPACITY_CHANGED: Asc = (0x2a, 0x09);
pub const REPORTED_LUNS_CHANGED: Asc = (0x3f, 0x0e);
pub const INTERNAL_TARGET_FAILURE: Asc = (0x44, 0x00);
pub const COMMANDS_CLEARED_BY_ANOTHER: Asc = (0x2f, 0x00);

/// One sense: key, code, and the optional information and sense-key-specific fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sense {
    pub key: u8,
    pub asc: Asc,
    /// The information field (an LBA, or a miscompare's byte offset).
    pub info: Option<u64>,
    /// Sense-key specific: the field pointer of an invalid field (byte, and the bit when
    /// it is not the whole byte), in the CDB (`cdb`) or the parameter data.
    pub field: Option<Field>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub cdb: bool,
    pub byte: u16,
    pub bit: Option<u8>,
}

impl Sense {
    pub fn new(key: u8, asc: Asc) -> Sense {
        Sense {
            key,
            asc,
            info: None,
            field: None,
        }
    }

    /// ILLEGAL REQUEST, INVALID FIELD IN CDB, pointing at `byte` (and `bit`).
    pub fn cdb_field(byte: u16, bit: Option<u8>) -> Sense {
        Sense {
            field: Some(Field {
                cdb: true,
                byte,
                bit,
            }),
            ..Sense::new(ILLEGAL_REQUEST, INVALID_FIELD_IN_CDB)
        }
    }

    /// ILLEGAL REQUEST, INVALID FIELD IN PARAMETER LIST, pointing at `byte`.
    pub fn param_field(byte: u16) -> Sense {
        Sense {
            field: Some(Field {
                cdb: false,
                byte,
                bit: None,
            }),
            ..Sense::new(ILLEGAL_REQUEST, INVALID_FIELD_IN_PARAM)
        }
    }

    fn sks(&self) -> Option<[u8; 3]> {
        let f = self.field?;
        let mut b = [0x80u8, 0, 0];
        if f.cdb {
            b[0] |= 0x40;
        }
        if let Some(bit) = f.bit {
            b[0] |= 0x08 | (bit & 7);
        }
        b[1..3].copy_from_slice(&f.byte.to_be_bytes());
        Some(b)
    }

    /// The sense bytes: descriptor format when `descriptor`, else fixed.
    pub fn encode(&self, descriptor: bool) -> Vec<u8> {
        if descriptor {
            let mut s = vec![0x72, self.key & 0xf, self.asc.0, self.asc.1, 0, 0, 0, 0];
            if let Some(info) = self.info {
                s.extend_from_slice(&[0x00, 0x0a, 0x80, 0]);
                s.extend_from_slice(&info.to_be_bytes());
            }
            if let Some(k) = self.sks() {
                s.extend_from_slice(&[0x02, 0x06, 0, 0]);
                s.extend_from_slice(&k);
                s.push(0);
            }
            s[7] = (s.len() - 8) as u8;
            s
        } else {
            let mut s = vec![0u8; 18];
            s[0] = 0x70;
            s[2] = self.key & 0xf;
            s[7] = 10;
            s[12] = self.asc.0;
            s[13] = self.asc.1;
            if let Some(info) = self.info {
                s[0] |= 0x80;
                // Four bytes in the fixed format; larger values do not fit and are not valid.
                match u32::try_from(info) {
                    Ok(i) => s[3..7].copy_from_slice(&i.to_be_bytes()),
                    Err(_) => s[0] &= 0x7f,
                }
            }
            if let Some(k) = self.sks() {
                s[15..18].copy_from_slice(&k);
            }
            s
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_and_descriptor_formats() {
        let s = Sense::cdb_field(2, Some(5));
        let f = s.encode(false);
        assert_eq!(&f[..3], &[0x70, 0, ILLEGAL_REQUEST]);
        assert_eq!((f[12], f[13]), INVALID_FIELD_IN_CDB);
        assert_eq!(&f[15..18], &[0xcd, 0, 2]);
        let d = s.encode(true);
        assert_eq!(&d[..4], &[0x72, ILLEGAL_REQUEST, 0x24, 0]);
        assert_eq!(d[7] as usize, d.len() - 8);
        let m = Sense {
            info: Some(513),
            ..Sense::new(MISCOMPARE, MISCOMPARE_DURING_VERIFY)
        };
        let f = m.encode(false);
        assert_eq!(f[0], 0xf0);
        assert_eq!(&f[3..7], &513u32.to_be_bytes());
    }
}
