//! One iSCSI connection: login, then a discovery session or full feature phase (RFC 7143
//! sections 4, 7 and 11) with error recovery level 0.
//!
//! # Theory of operation
//! A connection is three tasks: a reader that turns bytes into PDUs, a writer that puts
//! PDUs on the wire (it stamps StatSN, ExpCmdSN and MaxCmdSN as each leaves, so they are
//! always current), and the session loop in between, which owns all the state:
//! - **Command ordering.** Non-immediate commands are delivered in CmdSN order; one outside
//!   the window [ExpCmdSN, MaxCmdSN] is dropped silently, as the RFC asks. MaxCmdSN moves
//!   as commands complete, so at most `WINDOW` are in flight.
//! - **Write data.** Immediate data, unsolicited Data-Out (up to FirstBurstLength when
//!   InitialR2T is No) and R2T-solicited Data-Out (each burst at most MaxBurstLength, at
//!   most MaxOutstandingR2T R2Ts out per task) fill the task's buffer; offsets, lengths,
//!   target transfer tags and DataSNs are checked against what was asked, and a violation
//!   ends the task with ABORTED COMMAND and a data-phase sense code, as tgt does (there is
//!   no recovery of the sequence at level 0; the connection goes on). The bytes solicited
//!   at once across tasks are bounded (`R2T_BUDGET`).
//! - **Execution.** A task whose data is in runs on the blocking pool (`Lu::execute`); its
//!   data-in goes out in PDUs of the initiator's MaxRecvDataSegmentLength, the status with
//!   the last one when there is no sense (phase collapse), with residuals against the
//!   expected data transfer length.
//! - **Task management.** ABORT TASK, ABORT TASK SET, CLEAR TASK SET, LUN RESET and
//!   TARGET WARM/COLD RESET; the response goes once the affected tasks have ended, and an
//!   aborted task sends no status.
//! - **Keepalive.** After `PING_AFTER` of silence the target sends a NOP-In that asks for an
//!   answer; a connection silent for `DEAD_AFTER` is closed.
//!
//! Every session registers its I_T nexus with the server, so a new login with the same
//! initiator name and ISID reinstates the session: the old connection is closed first.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};

use crate::login::{self, LoggedIn};
use crate::pdu::{self, Digests, Pdu, PduError, NO_TAG};
use crate::scsi::{self, Lu};
use crate::sense::{self, Sense};
use crate::target::{Target, Targets};
use crate::text;

/// Commands an initiator may have in flight on one connection.
const WINDOW: u32 = 64;
/// How long a login may take.
const LOGIN_TIMEOUT: Duration = Duration::from_secs(30);
/// Silence after which the target pings, and after which it gives up.
const PING_AFTER: Duration = Duration::from_secs(20);
const DEAD_AFTER: Duration = Duration::from_secs(60);
/// Bytes solicited by R2T at once across a connection's tasks.
const R2T_BUDGET: u64 = 64 << 20;
/// Data-phase errors (SAM-5): the task ends with ABORTED COMMAND and one of these.
const DATA_PHASE_ERROR: sense::Asc = (0x4b, 0x00);
const INVALID_TTT: sense::Asc = (0x4b, 0x01);
const TOO_MUCH_WRITE_DATA: sense::Asc = (0x4b, 0x02);
const DATA_OFFSET_ERROR: sense::Asc = (0x4b, 0x05);
/// Largest expected data transfer a write command may announce.
const MAX_WRITE_BYTES: u32 = scsi::MAX_XFER_BLOCKS * scsi::BLOCK as u32 * 2;

/// The sessions of one server, by I_T nexus, for reinstatement.
#[derive(Default)]
pub struct Sessions {
    map: Mutex<HashMap<String, (u64, watch::Sender<bool>)>>,
    next_tsih: AtomicU32,
    next_id: std::sync::atomic::AtomicU64,
}

impl Sessions {
    fn tsih(&self) -> u16 {
        loop {
            let t = (self.next_tsih.fetch_add(1, Ordering::Relaxed) % 0xffff + 1) as u16;
            if t != 0 {
                return t;
            }
        }
    }

    /// Registers a session of `nexus`, closing (and waiting for) an older one of it.
    async fn register(&self, nexus: &str) -> (u64, watch::Receiver<bool>) {
        let old = self.map.lock().get(nexus).map(|(id, tx)| {
            let _ = tx.send(true);
            *id
        });
        if let Some(id) = old {
            let until = Instant::now() + Duration::from_secs(10);
            while Instant::now() < until
                && self.map.lock().get(nexus).is_some_and(|(i, _)| *i == id)
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let (tx, rx) = watch::channel(false);
        self.map.lock().insert(nexus.to_string(), (id, tx));
        (id, rx)
    }

    fn unregister(&self, nexus: &str, id: u64) {
        let mut m = self.map.lock();
        if m.get(nexus).is_some_and(|(i, _)| *i == id) {
            m.remove(nexus);
        }
    }

    /// Closes every session (the server stops).
    pub fn close_all(&self) {
        for (_, tx) in self.map.lock().values() {
            let _ = tx.send(true);
        }
    }

    pub fn count(&self) -> usize {
        self.map.lock().len()
    }
}

/// What a connection needs of its server.
pub struct Shared {
    pub targets: Arc<Targets>,
    pub sessions: Sessions,
    pub stats: Arc<tank_service::stats::ProtocolStats>,
}

/// Sequence numbers the writer stamps.
struct Sn {
    stat: AtomicU32,
    exp_cmd: AtomicU32,
    max_cmd: AtomicU32,
}

enum Out {
    /// A PDU; `status`: it carries status and takes a StatSN.
    Pdu(Pdu, bool),
    /// Flush and close.
    Close,
}

/// `a < b` in serial number arithmetic (RFC 1982, 32 bits).
fn sn_lt(a: u32, b: u32) -> bool {
    a != b && b.wrapping_sub(a) < 0x8000_0000
}

/// Serves one accepted connection to its end.
pub async fn serve(shared: Arc<Shared>, stream: TcpStream) {
    let peer = stream
        .peer_addr()
        .map_or_else(|_| "?".to_string(), |a| a.to_string());
    let local = stream.local_addr().ok();
    let _ = stream.set_nodelay(true);
    let (mut rd, mut wr) = stream.into_split();
    let first = match tokio::time::timeout(
        LOGIN_TIMEOUT,
        pdu::read_pdu(&mut rd, Digests::default(), text::MAX_TEXT),
    )
    .await
    {
        Ok(Ok(p)) => p,
        Ok(Err(PduError::Closed)) => return,
        Ok(Err(e)) => {
            eprintln!("iscsi: {peer}: {e} before login");
            return;
        }
        Err(_) => return,
    };
    if first.opcode() != pdu::OP_LOGIN_REQ {
        // Anything before a login is refused and the connection closed.
        let _ = pdu::write_pdu(
            &mut wr,
            &pdu::reject(&first.bhs, pdu::REJECT_PROTOCOL),
            Digests::default(),
        )
        .await;
        return;
    }
    let targets = shared.targets.clone();
    let logged = tokio::time::timeout(
        LOGIN_TIMEOUT,
        login::login(&mut rd, &mut wr, first, &targets, || shared.sessions.tsih()),
    )
    .await;
    let logged = match logged {
        Ok(Ok(l)) => l,
        Ok(Err(f)) => {
            eprintln!("iscsi: {peer}: login refused: {}", f.why);
            return;
        }
        Err(_) => {
            eprintln!("iscsi: {peer}: login timed out");
            return;
        }
    };
    let _ = wr.flush().await;
    if logged.params.discovery {
        discovery(&shared, rd, wr, logged, local).await;
        return;
    }
    let Some(target) = logged.target.clone() else {
        return;
    };
    let nexus = format!(
        "{},i,0x{}",
        logged.params.initiator_name,
        hex::encode(logged.isid)
    );
    let (sid, kill) = shared.sessions.register(&nexus).await;
    let mut session = Session::new(shared.clone(), logged, target.clone(), nexus.clone(), local);
    session.run(rd, wr, kill).await;
    // The nexus is gone: its SPC-2 reservations go with it.
    for l in target.read().luns.values() {
        l.lu.nexus_lost(&nexus);
    }
    shared.sessions.unregister(&nexus, sid);
}

/// A discovery session: SendTargets and logout.
async fn discovery(
    shared: &Shared,
    mut rd: OwnedReadHalf,
    mut wr: OwnedWriteHalf,
    logged: LoggedIn,
    local: Option<SocketAddr>,
) {
    let digests = Digests {
        header: logged.params.header_digest,
        data: logged.params.data_digest,
    };
    let mut stat_sn = logged.stat_sn;
    let mut exp_cmd_sn = logged.cmd_sn;
    for _ in 0..1024 {
        let req = match tokio::time::timeout(
            DEAD_AFTER,
            pdu::read_pdu(&mut rd, digests, text::OUR_MAX_RECV_DATA as usize),
        )
        .await
        {
            Ok(Ok(p)) => p,
            _ => return,
        };
        if !req.immediate() {
            exp_cmd_sn = exp_cmd_sn.wrapping_add(1);
        }
        let mut resp = match req.opcode() {
            pdu::OP_TEXT_REQ => {
                let keys = text::parse(&req.data).unwrap_or_default();
                let mut out = Vec::new();
                for (k, v) in keys {
                    if k == "SendTargets" {
                        let names = if v == "All" {
                            shared.targets.names_for(&logged.params.initiator_name)
                        } else {
                            shared
                                .targets
                                .names_for(&logged.params.initiator_name)
                                .into_iter()
                                .filter(|n| *n == v)
                                .collect()
                        };
                        for n in names {
                            out.push(("TargetName".to_string(), n));
                            if let Some(a) = local {
                                out.push(("TargetAddress".to_string(), format!("{a},1")));
                            }
                        }
                    } else {
                        out.push((k, "NotUnderstood".to_string()));
                    }
                }
                let mut p = Pdu::new(pdu::OP_TEXT_RESP);
                p.set_itt(req.itt()).set_u32(20, NO_TAG);
                p.data = text::encode(&out);
                p
            }
            pdu::OP_LOGOUT_REQ => {
                let mut p = Pdu::new(pdu::OP_LOGOUT_RESP);
                p.set_itt(req.itt());
                p.set_sns(stat_sn, exp_cmd_sn, exp_cmd_sn.wrapping_add(WINDOW - 1));
                let _ = pdu::write_pdu(&mut wr, &p, digests).await;
                return;
            }
            pdu::OP_NOP_OUT if req.itt() != NO_TAG => {
                let mut p = Pdu::new(pdu::OP_NOP_IN);
                p.set_itt(req.itt()).set_u32(20, NO_TAG);
                p.data = req.data.clone();
                p
            }
            pdu::OP_NOP_OUT => continue,
            _ => pdu::reject(&req.bhs, pdu::REJECT_PROTOCOL),
        };
        resp.set_sns(stat_sn, exp_cmd_sn, exp_cmd_sn.wrapping_add(WINDOW - 1));
        stat_sn = stat_sn.wrapping_add(1);
        if pdu::write_pdu(&mut wr, &resp, digests).await.is_err() {
            return;
        }
    }
}

/// One R2T the initiator has not answered in full.
struct R2t {
    ttt: u32,
    offset: u32,
    len: u32,
    got: u32,
    data_sn: u32,
}

/// A command between its arrival and its end.
struct Task {
    lun: u16,
    lu: Arc<Lu>,
    cdb: Vec<u8>,
    edtl: u32,
    read: bool,
    write: bool,
    immediate: bool,
    buf: Vec<u8>,
    /// Bytes of the buffer received.
    got: u32,
    /// Unsolicited data may reach here; R2Ts cover the rest.
    unsolicited_end: u32,
    unsolicited_got: u32,
    unsolicited_data_sn: u32,
    /// The next offset to ask for by R2T.
    next_r2t: u32,
    r2tsn: u32,
    r2ts: Vec<R2t>,
    /// Counted in the R2T budget.
    budgeted: bool,
    running: bool,
    aborted: Arc<AtomicBool>,
    /// Task management waiting for this task to end.
    waiters: Vec<oneshot::Sender<()>>,
}

struct Session {
    shared: Arc<Shared>,
    params: text::Params,
    digests: Digests,
    chap_user: Option<String>,
    target: Arc<RwLock<Target>>,
    nexus: String,
    local: Option<SocketAddr>,
    sn: Arc<Sn>,
    out: Option<mpsc::Sender<Out>>,
    tasks: HashMap<u32, Task>,
    /// Out-of-order commands by CmdSN.
    pending: BTreeMap<u32, Pdu>,
    next_ttt: u32,
    r2t_queue: VecDeque<u32>,
    r2t_in_flight: u64,
    done_tx: mpsc::UnboundedSender<u32>,
    done_rx: Option<mpsc::UnboundedReceiver<u32>>,
    logout: Option<Pdu>,
    close_after: bool,
}

/// Why the session loop ends.
enum End {
    Closed,
    Protocol(String),
}

impl Session {
    fn new(
        shared: Arc<Shared>,
        logged: LoggedIn,
        target: Arc<RwLock<Target>>,
        nexus: String,
        local: Option<SocketAddr>,
    ) -> Session {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        Session {
            shared,
            digests: Digests {
                header: logged.params.header_digest,
                data: logged.params.data_digest,
            },
            params: logged.params,
            chap_user: logged.chap_user,
            target,
            nexus,
            local,
            sn: Arc::new(Sn {
                stat: AtomicU32::new(logged.stat_sn),
                exp_cmd: AtomicU32::new(logged.cmd_sn),
                max_cmd: AtomicU32::new(logged.cmd_sn.wrapping_add(WINDOW - 1)),
            }),
            out: None,
            tasks: HashMap::new(),
            pending: BTreeMap::new(),
            next_ttt: 1,
            r2t_queue: VecDeque::new(),
            r2t_in_flight: 0,
            done_tx,
            done_rx: Some(done_rx),
            logout: None,
            close_after: false,
        }
    }

    async fn run(
        &mut self,
        rd: OwnedReadHalf,
        wr: OwnedWriteHalf,
        mut kill: watch::Receiver<bool>,
    ) {
        let (out_tx, out_rx) = mpsc::channel::<Out>(256);
        self.out = Some(out_tx.clone());
        let writer = tokio::spawn(writer(wr, out_rx, self.sn.clone(), self.digests));
        let (in_tx, mut in_rx) = mpsc::channel::<Result<Pdu, PduError>>(16);
        let digests = self.digests;
        let reader = tokio::spawn(async move {
            let mut rd = rd;
            loop {
                let r = pdu::read_pdu(&mut rd, digests, text::OUR_MAX_RECV_DATA as usize).await;
                let stop = matches!(&r, Err(e) if !matches!(e, PduError::DataDigest(_)));
                if in_tx.send(r).await.is_err() || stop {
                    return;
                }
            }
        });
        let mut done_rx = self.done_rx.take().expect("one run");
        let mut last_heard = Instant::now();
        let mut pinged = false;
        let end = loop {
            let wait = if pinged { DEAD_AFTER } else { PING_AFTER };
            let quiet = tokio::time::sleep_until((last_heard + wait).into());
            tokio::select! {
                r = in_rx.recv() => {
                    last_heard = Instant::now();
                    pinged = false;
                    match r {
                        None | Some(Err(PduError::Closed)) => break End::Closed,
                        Some(Err(PduError::DataDigest(p))) => {
                            // The data cannot be trusted; at level 0 the connection ends.
                            self.send(pdu::reject(&p.bhs, pdu::REJECT_DATA_DIGEST), true).await;
                            break End::Protocol("data digest error".into());
                        }
                        Some(Err(e)) => break End::Protocol(e.to_string()),
                        Some(Ok(p)) => {
                            if let Err(why) = self.on_pdu(p).await {
                                break End::Protocol(why);
                            }
                        }
                    }
                }
                Some(itt) = done_rx.recv() => self.on_done(itt).await,
                _ = kill.changed() => break End::Closed,
                _ = quiet => {
                    if pinged {
                        break End::Protocol("the initiator stopped answering".into());
                    }
                    // Ask for an answer; silence until DEAD_AFTER closes the connection.
                    pinged = true;
                    let mut p = Pdu::new(pdu::OP_NOP_IN);
                    p.set_itt(NO_TAG).set_u32(20, self.ttt());
                    self.send(p, false).await;
                }
            }
            if self.logout.is_some() && self.tasks.is_empty() {
                let req = self.logout.take().expect("logout");
                let mut p = Pdu::new(pdu::OP_LOGOUT_RESP);
                p.set_itt(req.itt());
                p.bhs[2] = 0;
                self.send(p, true).await;
                break End::Closed;
            }
            if self.close_after && self.tasks.is_empty() {
                break End::Closed;
            }
        };
        if let End::Protocol(why) = &end {
            eprintln!("iscsi: {}: connection closed: {why}", self.nexus);
        }
        // Tasks still running finish on their own; nothing more is sent.
        for t in self.tasks.values() {
            t.aborted.store(true, Ordering::SeqCst);
        }
        let _ = out_tx.send(Out::Close).await;
        drop(out_tx);
        self.out = None;
        reader.abort();
        let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
    }

    fn ttt(&mut self) -> u32 {
        let t = self.next_ttt;
        self.next_ttt = self.next_ttt.wrapping_add(1);
        if self.next_ttt == NO_TAG {
            self.next_ttt = 1;
        }
        t
    }

    async fn send(&self, p: Pdu, status: bool) {
        if let Some(o) = &self.out {
            let _ = o.send(Out::Pdu(p, status)).await;
        }
    }

    fn lu(&self, lun: u16) -> Option<Arc<Lu>> {
        self.target
            .read()
            .lun_for(lun, &self.params.initiator_name, self.chap_user.as_deref())
    }

    /// Takes one PDU from the initiator; an error ends the connection.
    async fn on_pdu(&mut self, p: Pdu) -> Result<(), String> {
        match p.opcode() {
            pdu::OP_DATA_OUT => return self.on_data_out(p).await,
            pdu::OP_SNACK => {
                self.send(pdu::reject(&p.bhs, pdu::REJECT_SNACK), true)
                    .await;
                return Ok(());
            }
            pdu::OP_SCSI_CMD
            | pdu::OP_NOP_OUT
            | pdu::OP_TMF_REQ
            | pdu::OP_TEXT_REQ
            | pdu::OP_LOGOUT_REQ => {}
            pdu::OP_LOGIN_REQ => {
                self.send(pdu::reject(&p.bhs, pdu::REJECT_PROTOCOL), true)
                    .await;
                return Err("a login request in full feature phase".into());
            }
            _ => {
                self.send(pdu::reject(&p.bhs, pdu::REJECT_NOT_SUPPORTED), true)
                    .await;
                return Ok(());
            }
        }
        // A NOP-Out answering our ping takes no CmdSN and gets no answer.
        if p.opcode() == pdu::OP_NOP_OUT && p.itt() == NO_TAG {
            return Ok(());
        }
        if p.immediate() {
            return self.deliver(p).await;
        }
        let cmd_sn = p.u32_at(24);
        let exp = self.sn.exp_cmd.load(Ordering::SeqCst);
        let max = self.sn.max_cmd.load(Ordering::SeqCst);
        if sn_lt(cmd_sn, exp) || sn_lt(max, cmd_sn) {
            // Outside the window: ignored, as RFC 7143 4.2.2.1 says.
            return Ok(());
        }
        if cmd_sn != exp {
            self.pending.insert(cmd_sn, p);
            return Ok(());
        }
        self.sn.exp_cmd.store(exp.wrapping_add(1), Ordering::SeqCst);
        self.deliver(p).await?;
        loop {
            let exp = self.sn.exp_cmd.load(Ordering::SeqCst);
            let Some(next) = self.pending.remove(&exp) else {
                break;
            };
            self.sn.exp_cmd.store(exp.wrapping_add(1), Ordering::SeqCst);
            self.deliver(next).await?;
        }
        Ok(())
    }

    /// A command, in order.
    async fn deliver(&mut self, p: Pdu) -> Result<(), String> {
        match p.opcode() {
            pdu::OP_SCSI_CMD => self.on_command(p).await,
            pdu::OP_NOP_OUT => {
                let mut r = Pdu::new(pdu::OP_NOP_IN);
                r.set_itt(p.itt())
                    .set_u32(20, NO_TAG)
                    .set_lun_raw(p.lun_raw());
                let immediate = p.immediate();
                r.data = p.data;
                r.data.truncate(self.params.peer_max_recv_data as usize);
                self.window_moves(immediate);
                self.send(r, true).await;
                Ok(())
            }
            pdu::OP_TMF_REQ => {
                self.on_tmf(p).await;
                Ok(())
            }
            pdu::OP_TEXT_REQ => {
                self.on_text(p).await;
                Ok(())
            }
            pdu::OP_LOGOUT_REQ => {
                let reason = p.flags() & 0x7f;
                if reason == 2 {
                    // Removing a connection for recovery: not at level 0.
                    let mut r = Pdu::new(pdu::OP_LOGOUT_RESP);
                    r.set_itt(p.itt());
                    r.bhs[2] = 2;
                    self.window_moves(p.immediate());
                    self.send(r, true).await;
                    return Ok(());
                }
                self.window_moves(p.immediate());
                self.logout = Some(p);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// A non-immediate command has ended without a task: the window moves on.
    fn window_moves(&self, immediate: bool) {
        if !immediate {
            self.sn.max_cmd.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Ends a command at once, before it is a task, with CHECK CONDITION and `s` (fixed
    /// format sense: no unit's mode page applies).
    async fn check_now(&mut self, p: &Pdu, s: Sense) {
        let mut r = Pdu::new(pdu::OP_SCSI_RESP);
        r.set_itt(p.itt());
        r.bhs[3] = sense::CHECK_CONDITION;
        let sb = s.encode(false);
        let mut data = (sb.len() as u16).to_be_bytes().to_vec();
        data.extend_from_slice(&sb);
        r.data = data;
        let edtl = p.u32_at(20);
        if edtl > 0 {
            r.bhs[1] |= 0x02;
            r.set_u32(44, edtl);
        }
        self.window_moves(p.immediate());
        self.send(r, true).await;
    }

    async fn on_command(&mut self, p: Pdu) -> Result<(), String> {
        let itt = p.itt();
        if itt == NO_TAG || self.tasks.contains_key(&itt) {
            self.window_moves(p.immediate());
            self.send(pdu::reject(&p.bhs, pdu::REJECT_INVALID_FIELD), true)
                .await;
            return Ok(());
        }
        let flags = p.flags();
        let read = flags & 0x40 != 0;
        let write = flags & 0x20 != 0;
        let edtl = p.u32_at(20);
        let mut cdb = p.bhs[32..48].to_vec();
        // An extended CDB (AHS type 1) carries the bytes past the 16th.
        let mut at = 0;
        while at + 4 <= p.ahs.len() {
            let len = usize::from(u16::from_be_bytes([p.ahs[at], p.ahs[at + 1]]));
            let kind = p.ahs[at + 2];
            let body = at + 3..(at + 3 + len).min(p.ahs.len());
            if kind == 1 && body.len() > 1 {
                cdb.extend_from_slice(&p.ahs[body.start + 1..body.end]);
            }
            at += (3 + len).div_ceil(4) * 4;
        }
        if let Some(n) = scsi::cdb_len(cdb[0]) {
            cdb.truncate(n.max(cdb.len().min(16)).min(cdb.len()));
        }
        let lun_no = pdu::lun_number(p.lun_raw());
        let lu = lun_no.and_then(|n| self.lu(n));
        if cdb[0] == 0xa0 {
            // REPORT LUNS is the target's, whatever LUN it is sent to.
            let luns: Vec<Arc<Lu>> = {
                let t = self.target.read();
                t.visible(&self.params.initiator_name, self.chap_user.as_deref())
                    .into_values()
                    .collect()
            };
            for l in luns {
                l.luns_reported(&self.nexus);
            }
            return self.no_such_lun(&p, &cdb, read, edtl).await;
        }
        let Some(lu) = lu else {
            return self.no_such_lun(&p, &cdb, read, edtl).await;
        };
        let lun = lun_no.unwrap_or(0);
        if !p.data.is_empty() && (!write || !self.params.immediate_data) {
            return Err("immediate data the session did not agree to".into());
        }
        if p.data.len() as u64 > u64::from(edtl) || p.data.len() as u32 > self.params.first_burst {
            return Err("immediate data past the expected length or FirstBurstLength".into());
        }
        if write && edtl > MAX_WRITE_BYTES {
            self.check_now(&p, Sense::cdb_field(0, None)).await;
            return Ok(());
        }
        let immediate_len = p.data.len() as u32;
        let unsolicited_end = if !write {
            0
        } else if self.params.initial_r2t {
            immediate_len
        } else {
            self.params.first_burst.min(edtl).max(immediate_len)
        };
        let mut buf = if write {
            Vec::with_capacity(edtl as usize)
        } else {
            Vec::new()
        };
        buf.extend_from_slice(&p.data);
        let task = Task {
            lun,
            lu,
            cdb,
            edtl,
            read,
            write,
            immediate: p.immediate(),
            buf,
            got: immediate_len,
            unsolicited_end,
            unsolicited_got: immediate_len,
            unsolicited_data_sn: 0,
            next_r2t: unsolicited_end,
            r2tsn: 0,
            r2ts: Vec::new(),
            budgeted: false,
            running: false,
            aborted: Arc::new(AtomicBool::new(false)),
            waiters: Vec::new(),
        };
        self.tasks.insert(itt, task);
        if !write || immediate_len >= edtl {
            self.start(itt);
        } else if unsolicited_end < edtl {
            self.r2t_queue.push_back(itt);
            self.pump_r2ts().await;
        }
        Ok(())
    }

    /// REPORT LUNS, and a command for a LUN the initiator does not see: INQUIRY answers "no
    /// unit here", REQUEST SENSE says why, anything else is LOGICAL UNIT NOT SUPPORTED.
    async fn no_such_lun(
        &mut self,
        p: &Pdu,
        cdb: &[u8],
        read: bool,
        edtl: u32,
    ) -> Result<(), String> {
        let data: Vec<u8> = match cdb[0] {
            0xa0 => match self.report_luns(cdb) {
                Ok(d) => d,
                Err(s) => {
                    self.check_now(p, s).await;
                    return Ok(());
                }
            },
            0x12 => {
                let mut d = vec![0u8; 36];
                d[0] = 0x7f;
                d[2] = 0x06;
                d[3] = 0x12;
                d[4] = 31;
                let alloc = usize::from(u16::from_be_bytes([cdb[3], cdb[4]]));
                d.truncate(alloc);
                d
            }
            0x03 => {
                let mut d = Sense::new(sense::ILLEGAL_REQUEST, sense::LU_NOT_SUPPORTED)
                    .encode(cdb[1] & 1 != 0);
                d.truncate(usize::from(cdb[4]));
                d
            }
            _ => {
                self.check_now(
                    p,
                    Sense::new(sense::ILLEGAL_REQUEST, sense::LU_NOT_SUPPORTED),
                )
                .await;
                return Ok(());
            }
        };
        self.window_moves(p.immediate());
        let reply = scsi::Reply {
            status: sense::GOOD,
            sense: Vec::new(),
            data,
        };
        let pdus = responses(
            p.itt(),
            p.lun_raw(),
            read,
            false,
            edtl,
            None,
            reply,
            self.params.peer_max_recv_data,
            self.params.max_burst,
        );
        for (r, status) in pdus {
            self.send(r, status).await;
        }
        Ok(())
    }

    fn report_luns(&self, cdb: &[u8]) -> Result<Vec<u8>, Sense> {
        let alloc = u32::from_be_bytes([cdb[6], cdb[7], cdb[8], cdb[9]]) as usize;
        if alloc < 16 {
            return Err(Sense::cdb_field(6, None));
        }
        if cdb[2] > 2 && !(0x10..=0x12).contains(&cdb[2]) {
            return Err(Sense::cdb_field(2, None));
        }
        let luns: Vec<u16> = {
            let t = self.target.read();
            t.visible(&self.params.initiator_name, self.chap_user.as_deref())
                .keys()
                .copied()
                .collect()
        };
        let mut d = Vec::with_capacity(8 + 8 * luns.len());
        d.extend_from_slice(&((luns.len() * 8) as u32).to_be_bytes());
        d.extend_from_slice(&[0; 4]);
        for n in luns {
            d.extend_from_slice(&pdu::lun_raw(n).to_be_bytes());
        }
        d.truncate(alloc);
        Ok(d)
    }

    /// Sends R2Ts for queued tasks while the budget allows.
    async fn pump_r2ts(&mut self) {
        let max_burst = self.params.max_burst;
        let max_out = self.params.max_outstanding_r2t as usize;
        let mut sends = Vec::new();
        let mut i = 0;
        while i < self.r2t_queue.len() {
            let itt = self.r2t_queue[i];
            let Some(t) = self.tasks.get_mut(&itt) else {
                self.r2t_queue.remove(i);
                continue;
            };
            if !t.budgeted {
                if self.r2t_in_flight > 0 && self.r2t_in_flight + u64::from(t.edtl) > R2T_BUDGET {
                    break;
                }
                t.budgeted = true;
                self.r2t_in_flight += u64::from(t.edtl);
            }
            while t.next_r2t < t.edtl && t.r2ts.len() < max_out {
                let len = max_burst.min(t.edtl - t.next_r2t);
                let ttt = {
                    let v = self.next_ttt;
                    self.next_ttt = self.next_ttt.wrapping_add(1);
                    if self.next_ttt == NO_TAG {
                        self.next_ttt = 1;
                    }
                    v
                };
                t.r2ts.push(R2t {
                    ttt,
                    offset: t.next_r2t,
                    len,
                    got: 0,
                    data_sn: 0,
                });
                let mut r = Pdu::new(pdu::OP_R2T);
                r.set_lun_raw(pdu::lun_raw(t.lun))
                    .set_itt(itt)
                    .set_u32(20, ttt)
                    .set_u32(36, t.r2tsn)
                    .set_u32(40, t.next_r2t)
                    .set_u32(44, len);
                t.r2tsn += 1;
                t.next_r2t += len;
                sends.push(r);
            }
            if t.next_r2t >= t.edtl {
                self.r2t_queue.remove(i);
            } else {
                i += 1;
            }
        }
        for r in sends {
            self.send(r, false).await;
        }
    }

    async fn on_data_out(&mut self, p: Pdu) -> Result<(), String> {
        let itt = p.itt();
        match self.take_data_out(&p) {
            Ok(pump) => {
                if pump {
                    self.pump_r2ts().await;
                }
            }
            Err(asc) => {
                // The task ends with ABORTED COMMAND; the connection goes on (its later
                // Data-Out for the task is dropped).
                self.fail_task(itt, asc).await;
            }
        }
        Ok(())
    }

    /// Files one Data-Out into its task; whether R2Ts may go out now, or the data-phase
    /// error that ends the task.
    fn take_data_out(&mut self, p: &Pdu) -> Result<bool, sense::Asc> {
        let itt = p.itt();
        let ttt = p.u32_at(20);
        let data_sn = p.u32_at(36);
        let offset = p.u32_at(40);
        let len = p.data.len() as u32;
        let Some(t) = self.tasks.get_mut(&itt) else {
            // A task aborted or failed early: its remaining data is dropped.
            return Ok(false);
        };
        if t.running || !t.write {
            return Err(DATA_PHASE_ERROR);
        }
        let end = offset
            .checked_add(len)
            .filter(|e| *e <= t.edtl)
            .ok_or(TOO_MUCH_WRITE_DATA)?;
        if ttt == NO_TAG {
            // Unsolicited.
            if end > t.unsolicited_end {
                return Err(TOO_MUCH_WRITE_DATA);
            }
            if offset != t.unsolicited_got {
                return Err(DATA_OFFSET_ERROR);
            }
            if data_sn != t.unsolicited_data_sn {
                return Err(DATA_PHASE_ERROR);
            }
            t.unsolicited_data_sn += 1;
            t.unsolicited_got = end;
        } else {
            let Some(r) = t.r2ts.iter_mut().find(|r| r.ttt == ttt) else {
                return Err(INVALID_TTT);
            };
            if offset != r.offset + r.got || end > r.offset + r.len {
                return Err(DATA_OFFSET_ERROR);
            }
            if data_sn != r.data_sn {
                return Err(DATA_PHASE_ERROR);
            }
            r.data_sn += 1;
            r.got += len;
        }
        let (from, to) = (offset as usize, end as usize);
        if from == t.buf.len() {
            // In order (the usual case): appended, with no zero fill first.
            t.buf.extend_from_slice(&p.data);
        } else {
            // Another R2T's data came first: the gap is filled when its Data-Outs arrive.
            if t.buf.len() < to {
                t.buf.resize(to, 0);
            }
            t.buf[from..to].copy_from_slice(&p.data);
        }
        t.got += len;
        let mut pump = false;
        if ttt != NO_TAG {
            if let Some(i) = t.r2ts.iter().position(|r| r.ttt == ttt && r.got == r.len) {
                t.r2ts.remove(i);
                pump = true;
            }
        }
        let complete = t.got >= t.edtl && t.r2ts.is_empty() && t.next_r2t >= t.edtl;
        let more = !t.running && t.next_r2t < t.edtl;
        if complete {
            self.start(itt);
            pump = true;
        } else if pump && more && !self.r2t_queue.contains(&itt) {
            self.r2t_queue.push_front(itt);
        }
        Ok(pump)
    }

    /// Ends a task that has not run with CHECK CONDITION, ABORTED COMMAND and `asc`.
    async fn fail_task(&mut self, itt: u32, asc: sense::Asc) {
        let Some(t) = self.tasks.remove(&itt) else {
            return;
        };
        if t.budgeted {
            self.r2t_in_flight = self.r2t_in_flight.saturating_sub(u64::from(t.edtl));
        }
        self.r2t_queue.retain(|i| *i != itt);
        let reply = scsi::Reply {
            status: sense::CHECK_CONDITION,
            sense: Sense::new(sense::ABORTED_COMMAND, asc).encode(false),
            data: Vec::new(),
        };
        self.window_moves(t.immediate);
        let pdus = responses(
            itt,
            pdu::lun_raw(t.lun),
            t.read,
            t.write,
            t.edtl,
            Some(u64::from(t.edtl)),
            reply,
            self.params.peer_max_recv_data,
            self.params.max_burst,
        );
        for (r, status) in pdus {
            self.send(r, status).await;
        }
        for w in t.waiters {
            let _ = w.send(());
        }
        self.pump_r2ts().await;
    }

    /// Runs a task whose data is in.
    fn start(&mut self, itt: u32) {
        let Some(t) = self.tasks.get_mut(&itt) else {
            return;
        };
        t.running = true;
        if t.budgeted {
            self.r2t_in_flight = self.r2t_in_flight.saturating_sub(u64::from(t.edtl));
            t.budgeted = false;
        }
        let lu = t.lu.clone();
        let cdb = t.cdb.clone();
        let data = std::mem::take(&mut t.buf);
        let nexus = self.nexus.clone();
        let aborted = t.aborted.clone();
        let out = self.out.clone();
        let done = self.done_tx.clone();
        let sn = self.sn.clone();
        let (read, write, edtl, immediate, lun) = (t.read, t.write, t.edtl, t.immediate, t.lun);
        let peer_max = self.params.peer_max_recv_data;
        let max_burst = self.params.max_burst;
        let stats = self.shared.stats.clone();
        // The units an EXTENDED COPY may name: those this session sees.
        let peers: Vec<Arc<Lu>> = if cdb[0] == 0x83 {
            self.target
                .read()
                .visible(&self.params.initiator_name, self.chap_user.as_deref())
                .into_values()
                .collect()
        } else {
            Vec::new()
        };
        tokio::spawn(async move {
            let began = Instant::now();
            let op = match cdb[0] {
                0x08 | 0x28 | 0xa8 | 0x88 => "read",
                0x0a | 0x2a | 0xaa | 0x8a | 0x2e | 0xae | 0x8e | 0x9c | 0x89 | 0x8b => "write",
                0x35 | 0x91 => "sync",
                0x42 | 0x41 | 0x93 => "unmap",
                0x83 => "copy",
                _ => "other",
            };
            let cdb2 = cdb.clone();
            let reply =
                tokio::task::spawn_blocking(move || lu.execute(&nexus, &cdb2, &data, &peers))
                    .await
                    .unwrap_or_else(|_| scsi::Reply {
                        status: sense::CHECK_CONDITION,
                        sense: Sense::new(sense::HARDWARE_ERROR, sense::INTERNAL_TARGET_FAILURE)
                            .encode(false),
                        data: Vec::new(),
                    });
            stats
                .op("iscsi", op)
                .record(began.elapsed(), reply.status != sense::GOOD);
            if !immediate {
                sn.max_cmd.fetch_add(1, Ordering::SeqCst);
            }
            if !aborted.load(Ordering::SeqCst) {
                if let Some(out) = out {
                    let need = if write {
                        scsi::data_out_len(&cdb)
                    } else {
                        None
                    };
                    let pdus = responses(
                        itt,
                        pdu::lun_raw(lun),
                        read,
                        write,
                        edtl,
                        need,
                        reply,
                        peer_max,
                        max_burst,
                    );
                    for (p, status) in pdus {
                        if out.send(Out::Pdu(p, status)).await.is_err() {
                            break;
                        }
                    }
                }
            }
            let _ = done.send(itt);
        });
    }

    async fn on_done(&mut self, itt: u32) {
        if let Some(t) = self.tasks.remove(&itt) {
            for w in t.waiters {
                let _ = w.send(());
            }
        }
    }

    /// Ends a task before it runs, or marks a running one so that it sends nothing; the
    /// returned receiver fires once it has ended.
    fn abort(&mut self, itt: u32) -> Option<oneshot::Receiver<()>> {
        let t = self.tasks.get_mut(&itt)?;
        t.aborted.store(true, Ordering::SeqCst);
        if t.running {
            let (tx, rx) = oneshot::channel();
            t.waiters.push(tx);
            Some(rx)
        } else {
            let t = self.tasks.remove(&itt).expect("present");
            if t.budgeted {
                self.r2t_in_flight = self.r2t_in_flight.saturating_sub(u64::from(t.edtl));
            }
            self.r2t_queue.retain(|i| *i != itt);
            if !t.immediate {
                self.sn.max_cmd.fetch_add(1, Ordering::SeqCst);
            }
            None
        }
    }

    async fn on_tmf(&mut self, p: Pdu) {
        let function = p.flags() & 0x7f;
        let lun_no = pdu::lun_number(p.lun_raw());
        let rtt = p.u32_at(20);
        let ref_cmd_sn = p.u32_at(32);
        let cmd_sn = p.u32_at(24);
        let mut waits = Vec::new();
        let mut close = false;
        let response: u8 = match function {
            // ABORT TASK
            1 => match self.tasks.get(&rtt) {
                Some(t) if Some(t.lun) == lun_no => {
                    waits.extend(self.abort(rtt));
                    0
                }
                Some(_) => 1,
                None => {
                    let exp = self.sn.exp_cmd.load(Ordering::SeqCst);
                    let max = self.sn.max_cmd.load(Ordering::SeqCst);
                    let in_window = !sn_lt(ref_cmd_sn, exp) && !sn_lt(max, ref_cmd_sn);
                    if in_window && sn_lt(ref_cmd_sn, cmd_sn) {
                        0
                    } else {
                        1
                    }
                }
            },
            // ABORT TASK SET, CLEAR TASK SET, LOGICAL UNIT RESET
            2 | 4 | 5 => match lun_no.and_then(|n| self.lu(n).map(|lu| (n, lu))) {
                None => 2,
                Some((n, lu)) => {
                    let itts: Vec<u32> = self
                        .tasks
                        .iter()
                        .filter(|(_, t)| t.lun == n)
                        .map(|(i, _)| *i)
                        .collect();
                    for i in itts {
                        waits.extend(self.abort(i));
                    }
                    if function == 5 {
                        lu.reset();
                    }
                    0
                }
            },
            // TARGET WARM RESET, TARGET COLD RESET
            6 | 7 => {
                let itts: Vec<u32> = self.tasks.keys().copied().collect();
                for i in itts {
                    waits.extend(self.abort(i));
                }
                let luns: Vec<Arc<Lu>> = self
                    .target
                    .read()
                    .luns
                    .values()
                    .map(|l| l.lu.clone())
                    .collect();
                for lu in luns {
                    lu.reset();
                }
                close = function == 7;
                0
            }
            // TASK REASSIGN: no allegiance reassignment at level 0.
            8 => 4,
            _ => 5,
        };
        let out = self.out.clone();
        let itt = p.itt();
        self.window_moves(p.immediate());
        tokio::spawn(async move {
            for w in waits {
                let _ = tokio::time::timeout(Duration::from_secs(30), w).await;
            }
            let mut r = Pdu::new(pdu::OP_TMF_RESP);
            r.set_itt(itt);
            r.bhs[2] = response;
            if let Some(o) = out {
                let _ = o.send(Out::Pdu(r, true)).await;
                if close {
                    let _ = o.send(Out::Close).await;
                }
            }
        });
        if close {
            self.close_after = true;
        }
    }

    async fn on_text(&mut self, p: Pdu) {
        let keys = text::parse(&p.data).unwrap_or_default();
        let mut out = Vec::new();
        for (k, v) in keys {
            if k == "SendTargets" {
                // In a normal session: this target only.
                let iqn = self.target.read().iqn.clone();
                if v == "All" || v.is_empty() || v == iqn {
                    out.push(("TargetName".to_string(), iqn));
                    if let Some(a) = self.local {
                        out.push(("TargetAddress".to_string(), format!("{a},1")));
                    }
                }
            } else {
                out.push((k, "NotUnderstood".to_string()));
            }
        }
        let mut r = Pdu::new(pdu::OP_TEXT_RESP);
        r.set_itt(p.itt()).set_u32(20, NO_TAG);
        r.data = text::encode(&out);
        self.window_moves(p.immediate());
        self.send(r, true).await;
    }
}

/// The PDUs that end a command: Data-In (the status on the last when there is no sense)
/// and a SCSI Response when needed, with residuals against `edtl` (and, for a write, the
/// bytes the CDB asked for: `need`).
#[allow(clippy::too_many_arguments)]
fn responses(
    itt: u32,
    lun_raw: u64,
    read: bool,
    write: bool,
    edtl: u32,
    need: Option<u64>,
    reply: scsi::Reply,
    peer_max: u32,
    max_burst: u32,
) -> Vec<(Pdu, bool)> {
    let mut out = Vec::new();
    let produced = reply.data.len() as u64;
    let edtl64 = u64::from(edtl);
    // Residual: overflow (0x04) or underflow (0x02), and the count.
    let (flag, residual) = if read && !write {
        if produced > edtl64 {
            (0x04u8, produced - edtl64)
        } else if produced < edtl64 {
            (0x02, edtl64 - produced)
        } else {
            (0, 0)
        }
    } else if write {
        let need = need.unwrap_or(edtl64);
        if need > edtl64 {
            (0x04, need - edtl64)
        } else if need < edtl64 {
            (0x02, edtl64 - need)
        } else {
            (0, 0)
        }
    } else if edtl64 > 0 {
        (0x02, edtl64)
    } else {
        (0, 0)
    };
    let residual = residual.min(u64::from(u32::MAX)) as u32;
    let send = if read {
        &reply.data[..(produced.min(edtl64)) as usize]
    } else {
        &[][..]
    };
    let collapse = reply.sense.is_empty()
        && (reply.status == sense::GOOD || reply.status == sense::CONDITION_MET)
        && !send.is_empty();
    let seg = peer_max.max(512) as usize;
    let burst = max_burst.max(512) as usize;
    let mut data_sn = 0u32;
    let mut off = 0usize;
    while off < send.len() {
        let n = seg.min(send.len() - off);
        // A PDU does not cross a burst boundary; the last of each burst has F.
        let n = n.min(burst - off % burst);
        let last = off + n == send.len();
        let mut p = Pdu::new(pdu::OP_DATA_IN);
        let end_of_burst = last || (off + n).is_multiple_of(burst);
        p.bhs[1] = if end_of_burst { 0x80 } else { 0 };
        p.set_lun_raw(lun_raw)
            .set_itt(itt)
            .set_u32(20, NO_TAG)
            .set_u32(36, data_sn)
            .set_u32(40, off as u32);
        p.data = send[off..off + n].to_vec();
        let with_status = last && collapse;
        if with_status {
            p.bhs[1] |= 0x01 | flag;
            p.bhs[3] = reply.status;
            p.set_u32(44, residual);
        }
        out.push((p, with_status));
        data_sn += 1;
        off += n;
    }
    if !collapse {
        let mut r = Pdu::new(pdu::OP_SCSI_RESP);
        r.bhs[1] = 0x80 | flag;
        r.bhs[3] = reply.status;
        r.set_itt(itt).set_u32(36, data_sn).set_u32(44, residual);
        if !reply.sense.is_empty() {
            let mut d = (reply.sense.len() as u16).to_be_bytes().to_vec();
            d.extend_from_slice(&reply.sense);
            r.data = d;
        }
        out.push((r, true));
    }
    out
}

/// Puts PDUs on the wire, stamping the sequence numbers as each leaves.
async fn writer(wr: OwnedWriteHalf, mut rx: mpsc::Receiver<Out>, sn: Arc<Sn>, digests: Digests) {
    let mut w = BufWriter::with_capacity(256 * 1024, wr);
    while let Some(o) = rx.recv().await {
        match o {
            Out::Close => break,
            Out::Pdu(mut p, status) => {
                let stat = if status {
                    sn.stat.fetch_add(1, Ordering::SeqCst)
                } else {
                    sn.stat.load(Ordering::SeqCst)
                };
                let exp = sn.exp_cmd.load(Ordering::SeqCst);
                let max = sn.max_cmd.load(Ordering::SeqCst);
                if p.opcode() == pdu::OP_DATA_IN && p.bhs[1] & 0x01 == 0 {
                    // StatSN is reserved in a Data-In without status.
                    p.set_sns(0, exp, max);
                } else {
                    p.set_sns(stat, exp, max);
                }
                if w.write_all(&pdu::encode(&p, digests)).await.is_err() {
                    return;
                }
                if rx.is_empty() && w.flush().await.is_err() {
                    return;
                }
            }
        }
    }
    let _ = w.flush().await;
    let _ = w.into_inner().shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_numbers_compare_across_the_wrap() {
        assert!(sn_lt(1, 2));
        assert!(sn_lt(u32::MAX, 0));
        assert!(!sn_lt(0, u32::MAX));
        assert!(!sn_lt(5, 5));
    }

    fn reply(n: usize) -> scsi::Reply {
        scsi::Reply {
            status: sense::GOOD,
            sense: Vec::new(),
            data: vec![7; n],
        }
    }

    #[test]
    fn reads_split_by_segment_and_burst_with_residuals() {
        // 10 000 bytes asked, 4096 produced: underflow 5904, status on the last Data-In.
        let p = responses(1, 0, true, false, 10_000, None, reply(4096), 1024, 2048);
        assert_eq!(p.len(), 4);
        let last = &p[3].0;
        assert_eq!(last.bhs[1] & 0x83, 0x83);
        assert_eq!(last.u32_at(44), 5904);
        assert!(p[1].0.bhs[1] & 0x80 != 0, "end of the first burst");
        assert!(p[0].0.bhs[1] & 0x80 == 0);
        // 200 asked, 512 produced: 200 sent, overflow 312.
        let p = responses(1, 0, true, false, 200, None, reply(512), 8192, 1 << 20);
        assert_eq!(p[0].0.data.len(), 200);
        assert_eq!(p[0].0.bhs[1] & 0x04, 0x04);
        assert_eq!(p[0].0.u32_at(44), 312);
        // A check condition: no data, a SCSI Response with sense.
        let r = scsi::Reply {
            status: sense::CHECK_CONDITION,
            sense: vec![0x70; 18],
            data: Vec::new(),
        };
        let p = responses(1, 0, true, false, 512, None, r, 8192, 1 << 20);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].0.opcode(), pdu::OP_SCSI_RESP);
        assert_eq!(p[0].0.data.len(), 20);
    }

    #[test]
    fn write_residuals_follow_the_cdb() {
        let p = responses(1, 0, false, true, 1024, Some(512), reply(0), 8192, 1 << 20);
        assert_eq!(p[0].0.bhs[1] & 0x06, 0x02);
        assert_eq!(p[0].0.u32_at(44), 512);
        let p = responses(1, 0, false, true, 512, Some(1024), reply(0), 8192, 1 << 20);
        assert_eq!(p[0].0.bhs[1] & 0x06, 0x04);
    }
}
