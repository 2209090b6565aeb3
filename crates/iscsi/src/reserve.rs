//! Reservations of a logical unit: SPC-2's RESERVE(6)/RELEASE(6) and SPC-4's persistent
//! reservations (PERSISTENT RESERVE IN and OUT), which clusters use to fence each other.
//!
//! # Theory of operation
//! Each I_T nexus is named by its SCSI initiator port name (`INITIATOR,i,0xISID`), so a
//! session that reconnects with the same ISID is the same nexus again. [`Reservations`]
//! holds the registrations (nexus and key), the persistent reservation (holder and type),
//! the generation counter and the SPC-2 reservation, and answers [`Reservations::access`]
//! for every command: allowed, or RESERVATION CONFLICT, by SPC-4's tables for each
//! reservation type. Registrations and reservations live in memory: they survive the loss
//! of an I_T nexus and resets. When the last REGISTER asked for it (APTPL, "activate
//! persist through power loss"), the unit also keeps them in a file ([`Reservations::encode`],
//! saved by `scsi.rs` before a change is answered), and a restarted target starts from it;
//! a REGISTER without APTPL removes the file. SPC-2 reservations never persist.

use crate::sense::{self, Sense};

pub const WRITE_EXCLUSIVE: u8 = 1;
pub const EXCLUSIVE_ACCESS: u8 = 3;
pub const WRITE_EXCLUSIVE_RO: u8 = 5;
pub const EXCLUSIVE_ACCESS_RO: u8 = 6;
pub const WRITE_EXCLUSIVE_AR: u8 = 7;
pub const EXCLUSIVE_ACCESS_AR: u8 = 8;

const INVALID_RELEASE: sense::Asc = (0x26, 0x04);

/// How a command touches the medium, for the conflict tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Allowed whatever the reservations (INQUIRY, REPORT LUNS, REQUEST SENSE, ...).
    Always,
    Read,
    Write,
}

#[derive(Debug, Clone)]
struct Registration {
    nexus: String,
    key: u64,
}

#[derive(Debug, Clone)]
struct Held {
    holder: String,
    kind: u8,
}

/// A unit attention for other nexuses, raised by a change here.
pub type Attention = (String, sense::Asc);

#[derive(Debug, Default, Clone)]
pub struct Reservations {
    /// Persist through power loss: set by the last REGISTER.
    aptpl: bool,
    generation: u32,
    regs: Vec<Registration>,
    res: Option<Held>,
    /// SPC-2 RESERVE(6): the nexus that holds the unit.
    legacy: Option<String>,
}

fn all_registrants(kind: u8) -> bool {
    matches!(kind, WRITE_EXCLUSIVE_AR | EXCLUSIVE_ACCESS_AR)
}

fn registrants_only(kind: u8) -> bool {
    matches!(
        kind,
        WRITE_EXCLUSIVE_RO | EXCLUSIVE_ACCESS_RO | WRITE_EXCLUSIVE_AR | EXCLUSIVE_ACCESS_AR
    )
}

fn exclusive_access(kind: u8) -> bool {
    matches!(
        kind,
        EXCLUSIVE_ACCESS | EXCLUSIVE_ACCESS_RO | EXCLUSIVE_ACCESS_AR
    )
}

/// What a PERSISTENT RESERVE OUT did: GOOD, a conflict, or a check condition.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Good(Vec<Attention>),
    Conflict,
    Check(Sense),
}

impl Reservations {
    fn key_of(&self, nexus: &str) -> Option<u64> {
        self.regs.iter().find(|r| r.nexus == nexus).map(|r| r.key)
    }

    fn is_holder(&self, nexus: &str) -> bool {
        match &self.res {
            Some(h) if all_registrants(h.kind) => self.key_of(nexus).is_some(),
            Some(h) => h.holder == nexus,
            None => false,
        }
    }

    /// May `nexus` run a command of class `access`?
    pub fn access(&self, nexus: &str, access: Access, opcode: u8) -> bool {
        if let Some(l) = &self.legacy {
            if l != nexus {
                // SPC-2: everything but the commands that must always work conflicts;
                // RELEASE from another nexus is a no-op that succeeds.
                return access == Access::Always && opcode != 0x5e && opcode != 0x5f
                    || opcode == 0x17;
            }
        }
        if access == Access::Always {
            return true;
        }
        let Some(h) = &self.res else { return true };
        if self.is_holder(nexus) {
            return true;
        }
        if registrants_only(h.kind) && self.key_of(nexus).is_some() {
            return true;
        }
        access == Access::Read && !exclusive_access(h.kind)
    }

    /// RESERVE(6).
    pub fn reserve6(&mut self, nexus: &str) -> bool {
        if self.res.is_some() || self.legacy.as_deref().is_some_and(|l| l != nexus) {
            return false;
        }
        self.legacy = Some(nexus.to_string());
        true
    }

    /// RELEASE(6): a no-op unless `nexus` holds the unit.
    pub fn release6(&mut self, nexus: &str) {
        if self.legacy.as_deref() == Some(nexus) {
            self.legacy = None;
        }
    }

    /// An I_T nexus is gone (logout, a dropped connection): its SPC-2 reservation goes;
    /// persistent ones stay.
    pub fn nexus_lost(&mut self, nexus: &str) {
        self.release6(nexus);
    }

    /// A LUN reset or target reset: the SPC-2 reservation is released.
    pub fn reset(&mut self) {
        self.legacy = None;
    }

    /// Whether an SPC-2 reservation by another nexus makes PR commands conflict.
    pub fn legacy_conflict(&self, nexus: &str) -> bool {
        self.legacy.as_deref().is_some_and(|l| l != nexus)
    }

    fn others(&self, nexus: &str) -> Vec<String> {
        self.regs
            .iter()
            .filter(|r| r.nexus != nexus)
            .map(|r| r.nexus.clone())
            .collect()
    }

    /// PERSISTENT RESERVE OUT with service action `sa`, scope and `kind` from the CDB, and
    /// the basic parameter list (`key`, `sa_key`, `aptpl`).
    pub fn out(
        &mut self,
        nexus: &str,
        sa: u8,
        kind: u8,
        key: u64,
        sa_key: u64,
        aptpl: bool,
    ) -> Outcome {
        use Outcome::*;
        let mine = self.key_of(nexus);
        match sa {
            // REGISTER, REGISTER AND IGNORE EXISTING KEY
            0 | 6 => {
                if sa == 0 {
                    match mine {
                        None if key != 0 => return Conflict,
                        Some(k) if k != key => return Conflict,
                        _ => {}
                    }
                }
                // The last successful REGISTER decides whether the state persists.
                self.aptpl = aptpl;
                if mine.is_none() && sa_key == 0 {
                    return Good(Vec::new());
                }
                let mut attn = Vec::new();
                if sa_key == 0 {
                    let was_holder = self.is_holder(nexus);
                    self.regs.retain(|r| r.nexus != nexus);
                    if was_holder {
                        let kind = self.res.as_ref().map_or(0, |h| h.kind);
                        let last = self.regs.is_empty();
                        if !all_registrants(kind) || last {
                            self.res = None;
                            if registrants_only(kind) {
                                attn = self
                                    .others(nexus)
                                    .into_iter()
                                    .map(|n| (n, sense::RESERVATIONS_RELEASED))
                                    .collect();
                            }
                        }
                    }
                } else if let Some(r) = self.regs.iter_mut().find(|r| r.nexus == nexus) {
                    r.key = sa_key;
                } else {
                    self.regs.push(Registration {
                        nexus: nexus.to_string(),
                        key: sa_key,
                    });
                }
                self.generation = self.generation.wrapping_add(1);
                Good(attn)
            }
            // RESERVE
            1 => {
                if mine != Some(key) {
                    return Conflict;
                }
                if !matches!(kind, 1 | 3 | 5 | 6 | 7 | 8) {
                    return Check(Sense::cdb_field(2, Some(3)));
                }
                if self.legacy_conflict(nexus) {
                    return Conflict;
                }
                match &self.res {
                    None => {
                        self.res = Some(Held {
                            holder: nexus.to_string(),
                            kind,
                        });
                        Good(Vec::new())
                    }
                    Some(h) if self.is_holder(nexus) && h.kind == kind => Good(Vec::new()),
                    Some(_) => Conflict,
                }
            }
            // RELEASE
            2 => {
                if mine != Some(key) {
                    return Conflict;
                }
                let Some(h) = self.res.clone() else {
                    return Good(Vec::new());
                };
                if !self.is_holder(nexus) {
                    return Good(Vec::new());
                }
                if h.kind != kind {
                    return Check(Sense::new(sense::ILLEGAL_REQUEST, INVALID_RELEASE));
                }
                self.res = None;
                let attn = if registrants_only(h.kind) {
                    self.others(nexus)
                        .into_iter()
                        .map(|n| (n, sense::RESERVATIONS_RELEASED))
                        .collect()
                } else {
                    Vec::new()
                };
                Good(attn)
            }
            // CLEAR
            3 => {
                if mine != Some(key) {
                    return Conflict;
                }
                let attn = self
                    .others(nexus)
                    .into_iter()
                    .map(|n| (n, sense::RESERVATIONS_PREEMPTED))
                    .collect();
                self.regs.clear();
                self.res = None;
                self.generation = self.generation.wrapping_add(1);
                Good(attn)
            }
            // PREEMPT, PREEMPT AND ABORT
            4 | 5 => {
                if mine != Some(key) {
                    return Conflict;
                }
                let held = self.res.clone();
                let mut attn = Vec::new();
                match held {
                    Some(h) if all_registrants(h.kind) && sa_key == 0 => {
                        // Every other registration goes; the reservation is this nexus's.
                        for n in self.others(nexus) {
                            attn.push((n, sense::REGISTRATIONS_PREEMPTED));
                        }
                        self.regs.retain(|r| r.nexus == nexus);
                        self.res = Some(Held {
                            holder: nexus.to_string(),
                            kind,
                        });
                    }
                    _ if sa_key == 0 => return Check(Sense::param_field(8)),
                    Some(h)
                        if !all_registrants(h.kind) && self.key_of(&h.holder) == Some(sa_key) =>
                    {
                        let gone: Vec<String> = self
                            .regs
                            .iter()
                            .filter(|r| r.key == sa_key && r.nexus != nexus)
                            .map(|r| r.nexus.clone())
                            .collect();
                        self.regs.retain(|r| r.key != sa_key || r.nexus == nexus);
                        for n in gone {
                            attn.push((n, sense::REGISTRATIONS_PREEMPTED));
                        }
                        self.res = Some(Held {
                            holder: nexus.to_string(),
                            kind,
                        });
                    }
                    _ => {
                        let gone: Vec<String> = self
                            .regs
                            .iter()
                            .filter(|r| r.key == sa_key)
                            .map(|r| r.nexus.clone())
                            .collect();
                        if gone.is_empty() {
                            return Conflict;
                        }
                        self.regs.retain(|r| r.key != sa_key);
                        for n in gone {
                            if n != nexus {
                                attn.push((n, sense::REGISTRATIONS_PREEMPTED));
                            }
                        }
                        if self
                            .res
                            .as_ref()
                            .is_some_and(|h| self.key_of(&h.holder).is_none())
                        {
                            self.res = None;
                        }
                    }
                }
                self.generation = self.generation.wrapping_add(1);
                Good(attn)
            }
            _ => Check(Sense::cdb_field(1, Some(4))),
        }
    }

    /// PERSISTENT RESERVE IN with service action `sa`; `port` names a nexus's transport ID.
    pub fn read(&self, sa: u8) -> Result<Vec<u8>, Sense> {
        let mut out = Vec::new();
        match sa {
            // READ KEYS
            0 => {
                out.extend_from_slice(&self.generation.to_be_bytes());
                out.extend_from_slice(&((self.regs.len() * 8) as u32).to_be_bytes());
                for r in &self.regs {
                    out.extend_from_slice(&r.key.to_be_bytes());
                }
            }
            // READ RESERVATION
            1 => {
                out.extend_from_slice(&self.generation.to_be_bytes());
                match &self.res {
                    None => out.extend_from_slice(&0u32.to_be_bytes()),
                    Some(h) => {
                        out.extend_from_slice(&16u32.to_be_bytes());
                        // All-registrants reservations report key 0.
                        let key = if all_registrants(h.kind) {
                            0
                        } else {
                            self.key_of(&h.holder).unwrap_or(0)
                        };
                        out.extend_from_slice(&key.to_be_bytes());
                        out.extend_from_slice(&[0, 0, 0, 0, 0, h.kind & 0xf, 0, 0]);
                    }
                }
            }
            // REPORT CAPABILITIES: CRH and PTPL_C, no SPEC_I_PT or ALL_TG_PT; the type
            // mask is valid; PTPL_A as the last REGISTER set it.
            2 => {
                out.extend_from_slice(&[0, 8, 0x11, 0x80 | u8::from(self.aptpl)]);
                // WR_EX_AR, EX_AC_RO, WR_EX_RO, EX_AC, WR_EX; then EX_AC_AR.
                out.extend_from_slice(&[0xea, 0x01, 0, 0]);
            }
            // READ FULL STATUS
            3 => {
                let mut descs = Vec::new();
                for r in &self.regs {
                    let mut d = Vec::new();
                    d.extend_from_slice(&r.key.to_be_bytes());
                    d.extend_from_slice(&[0; 4]);
                    let holder = self.is_holder(&r.nexus);
                    d.push(u8::from(holder));
                    d.push(if holder {
                        self.res.as_ref().map_or(0, |h| h.kind & 0xf)
                    } else {
                        0
                    });
                    d.extend_from_slice(&[0; 4]);
                    d.extend_from_slice(&1u16.to_be_bytes());
                    let tid = transport_id(&r.nexus);
                    d.extend_from_slice(&(tid.len() as u32).to_be_bytes());
                    d.extend_from_slice(&tid);
                    descs.extend_from_slice(&d);
                }
                out.extend_from_slice(&self.generation.to_be_bytes());
                out.extend_from_slice(&(descs.len() as u32).to_be_bytes());
                out.extend_from_slice(&descs);
            }
            _ => return Err(Sense::cdb_field(1, Some(4))),
        }
        Ok(out)
    }
}

impl Reservations {
    /// Whether the state persists through a restart (APTPL).
    pub fn persists(&self) -> bool {
        self.aptpl
    }

    /// The persistent part, as kept in its file: registrations, the reservation and the
    /// generation (the SPC-2 reservation is not kept).
    pub fn encode(&self) -> String {
        let mut s = format!(
            "tank persistent reservations 1\ngeneration {}\n",
            self.generation
        );
        for r in &self.regs {
            s.push_str(&format!("registration {:016x} {}\n", r.key, r.nexus));
        }
        if let Some(h) = &self.res {
            s.push_str(&format!("reservation {} {}\n", h.kind, h.holder));
        }
        s
    }

    /// The state a file kept (persisting, as it was kept because APTPL was set).
    pub fn decode(text: &str) -> Result<Reservations, String> {
        let mut lines = text.lines();
        if lines.next() != Some("tank persistent reservations 1") {
            return Err("not a persistent reservations file of this version".into());
        }
        let mut r = Reservations {
            aptpl: true,
            ..Reservations::default()
        };
        let name = |n: &str| -> Result<String, String> {
            if n.is_empty() || n.contains(char::is_whitespace) {
                return Err(format!("bad nexus name {n:?}"));
            }
            Ok(n.to_string())
        };
        for line in lines {
            let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
            match word {
                "generation" => {
                    r.generation = rest.parse().map_err(|_| format!("bad line {line:?}"))?;
                }
                "registration" => {
                    let (key, nexus) = rest.split_once(' ').ok_or(format!("bad line {line:?}"))?;
                    let key =
                        u64::from_str_radix(key, 16).map_err(|_| format!("bad line {line:?}"))?;
                    r.regs.push(Registration {
                        nexus: name(nexus)?,
                        key,
                    });
                }
                "reservation" => {
                    let (kind, holder) =
                        rest.split_once(' ').ok_or(format!("bad line {line:?}"))?;
                    let kind: u8 = kind.parse().map_err(|_| format!("bad line {line:?}"))?;
                    if !matches!(kind, 1 | 3 | 5 | 6 | 7 | 8) {
                        return Err(format!("bad reservation type {kind}"));
                    }
                    r.res = Some(Held {
                        holder: name(holder)?,
                        kind,
                    });
                }
                _ => return Err(format!("bad line {line:?}")),
            }
        }
        if let Some(h) = &r.res {
            if r.key_of(&h.holder).is_none() {
                return Err("the reservation's holder is not registered".into());
            }
        }
        Ok(r)
    }
}

/// An iSCSI TransportID (SPC-4 7.6.4.6, format 01b: the initiator port name with its ISID),
/// padded to a multiple of 4 bytes.
fn transport_id(nexus: &str) -> Vec<u8> {
    let mut name = nexus.as_bytes().to_vec();
    name.push(0);
    while !name.len().is_multiple_of(4) {
        name.push(0);
    }
    let mut t = vec![0x45, 0];
    t.extend_from_slice(&(name.len() as u16).to_be_bytes());
    t.extend_from_slice(&name);
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_reserve_and_conflict() {
        let mut r = Reservations::default();
        assert_eq!(r.out("a", 0, 0, 0, 1, false), Outcome::Good(vec![]));
        assert_eq!(r.out("b", 0, 0, 0, 2, false), Outcome::Good(vec![]));
        // A wrong key conflicts.
        assert_eq!(r.out("a", 0, 0, 9, 3, false), Outcome::Conflict);
        assert_eq!(
            r.out("a", 1, WRITE_EXCLUSIVE, 1, 0, false),
            Outcome::Good(vec![])
        );
        assert!(r.access("b", Access::Read, 0x28));
        assert!(!r.access("b", Access::Write, 0x2a));
        assert!(r.access("a", Access::Write, 0x2a));
        // b preempts a: a's registration goes, b holds.
        match r.out("b", 4, EXCLUSIVE_ACCESS, 2, 1, false) {
            Outcome::Good(attn) => assert_eq!(
                attn,
                vec![("a".to_string(), sense::REGISTRATIONS_PREEMPTED)]
            ),
            o => panic!("{o:?}"),
        }
        assert!(!r.access("a", Access::Read, 0x28));
        let keys = r.read(0).unwrap();
        assert_eq!(&keys[4..8], &8u32.to_be_bytes());
        assert_eq!(&keys[8..16], &2u64.to_be_bytes());
        assert_eq!(r.out("b", 3, 0, 2, 0, false), Outcome::Good(vec![]));
        assert!(r.access("a", Access::Write, 0x2a));
    }

    #[test]
    fn aptpl_state_round_trips_and_bad_files_are_refused() {
        let mut r = Reservations::default();
        assert!(matches!(
            r.out("a,i,0x1", 0, 0, 0, 7, true),
            Outcome::Good(_)
        ));
        assert!(matches!(
            r.out("b,i,0x2", 0, 0, 0, 9, true),
            Outcome::Good(_)
        ));
        assert!(matches!(
            r.out("a,i,0x1", 1, 1, 7, 0, false),
            Outcome::Good(_)
        ));
        assert!(r.persists());
        let back = Reservations::decode(&r.encode()).unwrap();
        assert_eq!(back.encode(), r.encode());
        assert!(back.persists());
        assert!(!back.access("b,i,0x2", Access::Write, 0x2a));
        assert!(back.access("a,i,0x1", Access::Write, 0x2a));
        // A REGISTER without APTPL turns it off.
        assert!(matches!(
            r.out("b,i,0x2", 0, 0, 9, 9, false),
            Outcome::Good(_)
        ));
        assert!(!r.persists());
        for bad in [
            "",
            "tank persistent reservations 2\n",
            "tank persistent reservations 1\ngeneration x\n",
            "tank persistent reservations 1\nregistration zz a\n",
            "tank persistent reservations 1\nreservation 2 a\n",
            "tank persistent reservations 1\nreservation 1 a\n",
            "tank persistent reservations 1\nsomething\n",
        ] {
            assert!(Reservations::decode(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn legacy_reserve_is_per_nexus_and_goes_with_it() {
        let mut r = Reservations::default();
        assert!(r.reserve6("a"));
        assert!(!r.reserve6("b"));
        assert!(!r.access("b", Access::Read, 0x28));
        assert!(r.access("b", Access::Always, 0x12));
        r.nexus_lost("a");
        assert!(r.reserve6("b"));
    }
}
