//! Per-volume host operations under deadlines, as kubelet's operation executor runs them: one
//! disk that stops answering (a frozen filesystem, a hung controller, a FUSE daemon that stopped)
//! costs the node only that disk, never the pass.
//!
//! Every operation names its subject (a volume's path, a device, a discovery directory) and gets
//! a deadline, counted from when a thread takes it up. The caller waits for it at most [`GRACE`]:
//! one still running then is pending, and its answer is kept for the next pass. An operation
//! that passes its deadline is *overdue*: its thread is left to the kernel (a syscall stuck in
//! the kernel cannot be cancelled), its subject is *unresponsive*, and every later operation on
//! that subject is refused at once, without a thread, until the stuck one returns. So a wedged
//! disk holds at most one thread per kind of operation.
//!
//! A job may name its *domain*, the filesystem its subject lies on (as the mount table says,
//! without touching it): while an operation of one subject of a domain is stuck, the domain's
//! other subjects are refused at once, and while one is slow (its caller went on without it)
//! they wait their turn without a thread. So volumes sharing a wedged filesystem cost it one
//! thread, not one each; volumes on other filesystems are not concerned.
//!
//! Threads held by operations that do not answer (stuck, or slow and left by their callers)
//! do not count against the [`WORKERS`] threads that serve answering subjects: the pool grows
//! by one for each, up to [`WEDGED_CAP`]. At the cap, which is reported ([`Operations::held`]),
//! the pool grows no more and only subjects that answered before get new operations, so a new
//! wedged one cannot take the answering threads.
//!
//! Host calls that may hang take an [`OnDeadline`], which only the pool's threads make: a call
//! outside the executor does not compile (a one-shot command an operator runs in a terminal
//! uses [`foreground`], by name).
//!
//! Once the stuck operation returns, the subject is retried with backoff in the background (the
//! pass does not wait for it): an operation that finishes within its deadline clears the
//! subject, and the owner's wake-up runs a pass that treats it as any other again. A disk that
//! answers but too slowly (a failing disk retrying every read) stays unresponsive without
//! slowing the passes down.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::core::reconcile::backoff::{Policy, with_jitter};

/// Threads held by operations that do not answer the pool adds at most, beside [`WORKERS`].
/// A held thread costs little: its stack is virtual memory, of which only the pages the stuck
/// call touched are resident (a few KiB to tens of KiB), plus a kernel task; 512 of them are a
/// few MiB at most. Operations on one wedged filesystem hold one thread (see [`Domain`]), so
/// the cap is reached only by as many separately wedged filesystems or devices: more than a
/// 90-disk JBOD behind one hung controller, with room for its discovery directories and
/// probes. Past it, further wedges would only add threads nobody can reclaim: the cap is
/// reported and new subjects wait for threads to return.
pub const WEDGED_CAP: usize = 512;

/// Threads for operations that answer: the host calls take microseconds to milliseconds, so
/// one runs a thousand volumes' inspections in a pass as fast as the single blocking call before
/// did (bench/bulk-publish.sh 1000: 8.7 to 9.0 s with 1, 2 or 4 threads), and each more costs its
/// stack (about 0.25 MiB resident). Threads held by wedged or slow disks do not count.
pub(crate) const WORKERS: usize = 1;

/// How long an idle pool thread stays before it exits (as tokio's blocking pool).
const IDLE_EXIT: Duration = Duration::from_secs(10);

/// Delays between background retries of an unresponsive subject once its stuck operation
/// returned: 1 s, doubling to 1 min (core::reconcile::backoff's rule, with its jitter).
const RETRY: Policy = Policy { initial: Duration::from_secs(1), max: Duration::from_secs(60) };

/// When the `failures`-th background retry of a subject may start, from `now`: jittered
/// (`random` in [0, 1)), so the volumes of one filesystem that came back are not all due at once.
fn retry_due(now: Instant, failures: u32, random: f64) -> Instant {
    now + with_jitter(RETRY.after(failures), random)
}

/// Why an unresponsive subject's operations give no result: one text per episode (named after
/// the operation that first stalled), so events and annotations built from it are not repeated
/// on every pass.
fn stalled_text(op: &str) -> String {
    format!("its {op} did not answer within its deadline (a call stuck in the kernel, or a disk too slow)")
}

/// How long a caller waits for an operation before going on without it (its answer is then
/// kept for the next pass): a pass meeting a newly wedged volume is held up this long, once.
pub(crate) const GRACE: Duration = Duration::from_millis(500);

/// How often a caller looks at jobs still queued (to grow the pool for them).
const QUEUE_LOOK: Duration = Duration::from_millis(20);

/// Jobs [`Operations::run_each`] runs at once.
const BATCH: usize = 128;

/// How long an answer nobody waited for is kept for the next pass.
const KEPT_FOR: Duration = Duration::from_secs(5);

/// What a caller gets for one operation.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer<T> {
    /// It finished: its result.
    Done(T),
    /// Still running within its deadline: nothing is concluded this pass; its answer is kept
    /// and its end wakes the owner.
    Pending,
    /// The subject does not answer: an operation on it passed its deadline.
    Unresponsive(Unresponsive),
}

impl<T> Answer<T> {
    /// The result, if it finished.
    pub fn done(self) -> Option<T> {
        match self {
            Answer::Done(v) => Some(v),
            _ => None,
        }
    }
}

impl<T> Answer<Result<T, String>> {
    /// The answer of an operation that itself answers `Result<_, String>`, as one result: a
    /// caller still waiting is told `pending`, and a subject that does not answer is an error.
    pub fn or_error(self, pending: &str) -> Result<T, String> {
        match self {
            Answer::Done(result) => result,
            Answer::Pending => Err(pending.to_string()),
            Answer::Unresponsive(e) => Err(e.to_string()),
        }
    }
}

/// An answer nobody waited for, kept for the next call.
struct Kept {
    op: &'static str,
    tag: String,
    at: Instant,
    value: Box<dyn std::any::Any + Send>,
}

/// What an operation is about: the thing one disk can wedge.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Subject {
    /// A volume, by its host path (as its PV records it).
    Volume(String),
    /// A block device, by its kernel name (a claim probe).
    Device(String),
    /// A class's discovery directory, by the path the agent sees.
    Directory(String),
    /// The configuration directory (the mounted ConfigMap), by the path the agent sees.
    Config(String),
    /// Work on the whole host that may meet any hung filesystem, by name (the scan of every
    /// process's open descriptors: one descriptor on a hung file holds it).
    Host(&'static str),
}

impl Subject {
    /// The host path of a volume subject.
    #[cfg(test)]
    pub fn volume_path(&self) -> Option<&str> {
        match self {
            Subject::Volume(p) => Some(p),
            _ => None,
        }
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Subject::Volume(p) => write!(f, "volume {p}"),
            Subject::Device(d) => write!(f, "device /dev/{d}"),
            Subject::Directory(d) => write!(f, "discovery directory {d}"),
            Subject::Config(d) => write!(f, "config directory {d}"),
            Subject::Host(what) => write!(f, "the {what}"),
        }
    }
}

/// Why an operation gave no result: its subject did not answer in time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{subject} is unresponsive: {what}")]
pub struct Unresponsive {
    /// What did not answer.
    pub subject: Subject,
    /// Which operation, and since when (for the operator).
    pub what: String,
}

/// One unresponsive subject, as reported (metrics, readiness, events).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stall {
    /// What does not answer.
    pub subject: Subject,
    /// The operation that passed its deadline.
    pub op: &'static str,
    /// How long ago it started.
    pub for_: Duration,
    /// Whether its thread is still stuck (else it returned, too late, and retries run).
    pub stuck: bool,
}

/// Proof that the code holding it runs on the executor's pool, under its operation's deadline:
/// host calls that may hang on a volume, device or discovery directory take `&OnDeadline`, so
/// calling one outside the executor does not compile. Made only by the pool's threads (and
/// [`foreground`]).
pub struct OnDeadline(());

/// Runs `work` on the calling thread with no deadline, for a one-shot command an operator runs
/// in a terminal (`local-static-provisioner disks`): a hang there is the operator's to see and
/// interrupt. Never for the agent, whose passes must not wait on a disk.
pub fn foreground<T>(work: impl FnOnce(&OnDeadline) -> T) -> T {
    work(&OnDeadline(()))
}

/// The filesystem (or device) a subject lies on, as known without touching it (the mount
/// table's `major:minor`): subjects of one domain wedge together, so a stuck operation of one
/// refuses the others at once instead of each holding a thread of its own.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Domain(String);

impl Domain {
    /// The filesystem on device `major:minor` (a mount table's `device`).
    pub fn filesystem(device: &str) -> Self {
        Domain(format!("filesystem {device}"))
    }
}

impl fmt::Display for Domain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The threads held by operations that do not answer, as reported (metrics, readiness, logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// Threads held now: operations past their deadline, or slow and left by their callers.
    pub threads: usize,
    /// The most the pool adds for them ([`WEDGED_CAP`]).
    pub cap: usize,
}

impl Held {
    /// Whether the cap is reached: the pool adds no thread for further held operations, and
    /// only subjects that answered before get new ones, until some return.
    pub fn cap_reached(&self) -> bool {
        self.threads >= self.cap
    }
}

/// The executor; cheap to clone (one shared state).
#[derive(Clone)]
pub struct Operations {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    pool: Arc<Pool>,
    /// Called when a stuck operation returns or a background retry ends: the owner runs a pass.
    wake: Mutex<Option<Arc<dyn Fn() + Send + Sync>>>,
    next_id: AtomicU64,
    /// The cap on held threads ([`WEDGED_CAP`]; smaller in unit tests).
    cap: usize,
}

#[derive(Default)]
struct State {
    /// Operations in flight, by subject.
    flights: BTreeMap<Subject, Vec<Flight>>,
    /// Subjects that passed a deadline and have not answered in time since.
    suspects: BTreeMap<Subject, Suspect>,
    /// Answers of operations whose callers went on without them, by subject.
    kept: BTreeMap<Subject, Kept>,
    /// Subjects whose last operation answered within its deadline: at the cap of held threads
    /// ([`WEDGED_CAP`]), only they get new operations.
    answered: BTreeSet<Subject>,
}

impl State {
    /// Flight `id` of `subject`.
    fn flight(&self, subject: &Subject, id: u64) -> Option<&Flight> {
        self.flights.get(subject)?.iter().find(|f| f.id == id)
    }

    fn flight_mut(&mut self, subject: &Subject, id: u64) -> Option<&mut Flight> {
        self.flights.get_mut(subject)?.iter_mut().find(|f| f.id == id)
    }

    /// Notes `subject` as unresponsive since `since`, its operation `op` past its deadline (a
    /// subject already noted keeps its first record).
    fn suspect(&mut self, subject: &Subject, op: &'static str, since: Instant, domain: Option<Domain>) {
        let suspect = Suspect { op, since, failures: 1, retry_at: None, domain, by_neighbour: false };
        self.suspects.entry(subject.clone()).or_insert(suspect);
    }

    /// The threads held now (see [`Occupied`]).
    fn occupied(&self, now: Instant) -> Occupied {
        let held = self.flights.values().flatten().filter(|f| f.held(now));
        let (long, wedged) = held.fold((0, 0), |(l, w), f| if f.long(now) { (l + 1, w) } else { (l, w + 1) });
        Occupied { long, wedged }
    }

    /// Why an operation on `subject` may not start at the cap of held threads (`held` of
    /// `cap`): a subject not seen answering could take the answering threads.
    fn over_cap(&self, subject: &Subject, held: usize, cap: usize) -> Option<Refusal> {
        (held >= cap && !self.answered.contains(subject)).then(|| {
            let what = format!(
                "the agent holds {held} threads of operations that do not answer (its cap); a volume not seen \
                 answering before is looked at once some return"
            );
            Refusal::Unresponsive(Unresponsive { subject: subject.clone(), what })
        })
    }

    /// The flights of other subjects than `subject` on `domain`.
    fn neighbours<'a>(
        &'a self,
        subject: &'a Subject,
        domain: Option<&'a Domain>,
    ) -> impl Iterator<Item = (&'a Subject, &'a Flight)> + 'a {
        let flights = domain.map(|d| {
            self.flights
                .iter()
                .filter(move |(s, _)| *s != subject)
                .flat_map(move |(s, v)| v.iter().filter(move |f| f.domain.as_ref() == Some(d)).map(move |f| (s, f)))
        });
        flights.into_iter().flatten()
    }

    /// Why an operation on `subject` in `domain` may not start now because of its neighbours:
    /// one of them is stuck (refused at once, and `subject` is unresponsive with it, retried
    /// once the stuck one returns), or slow and left by its caller (its turn comes once that
    /// one ends, without a thread meanwhile).
    fn held_by_neighbour(&mut self, subject: &Subject, domain: Option<&Domain>, now: Instant) -> Option<Refusal> {
        let mut slow = Vec::new();
        let mut stuck = None;
        for (other, f) in self.neighbours(subject, domain) {
            if f.running && f.deadline <= now {
                stuck = Some((other.clone(), f.op, f.started));
                break;
            }
            if f.running && !f.watched && f.held(now) {
                slow.push((other.clone(), f.id));
            }
        }
        if let Some((other, op, since)) = stuck {
            let on = domain.map(ToString::to_string).unwrap_or_default();
            let what = format!(
                "{other} on the same {on} did not answer its {op} within its deadline; looked at again once it returns"
            );
            let suspect =
                Suspect { op, since, failures: 1, retry_at: None, domain: domain.cloned(), by_neighbour: true };
            self.suspects.entry(subject.clone()).or_insert(suspect);
            return Some(Refusal::Unresponsive(Unresponsive { subject: subject.clone(), what }));
        }
        // Its turn comes when they end: each wakes the owner then.
        for (other, id) in &slow {
            if let Some(f) = self.flight_mut(other, *id) {
                f.waited_on = true;
            }
        }
        (!slow.is_empty()).then_some(Refusal::Busy)
    }

    /// After an operation on `domain` ended, with none of the domain stuck any more: its
    /// neighbours made unresponsive by a stuck one (see [`Self::held_by_neighbour`]) are cleared
    /// when it answered `in_time` (the filesystem answers again), else retried with backoff, one
    /// at a time. Whether any was.
    fn retry_neighbours(&mut self, subject: &Subject, domain: Option<&Domain>, in_time: bool, now: Instant) -> bool {
        let Some(domain) = domain else { return false };
        let State { flights, suspects, .. } = self;
        let now_stuck =
            flights.values().flatten().any(|f| f.domain.as_ref() == Some(domain) && f.running && f.deadline <= now);
        if in_time && !now_stuck {
            let before = suspects.len();
            suspects.retain(|s, x| !(x.by_neighbour && x.domain.as_ref() == Some(domain) && !flights.contains_key(s)));
            return suspects.len() < before;
        }
        let mut scheduled = false;
        if now_stuck {
            return false;
        }
        for (s, suspect) in suspects.iter_mut() {
            let idle = s != subject && suspect.retry_at.is_none() && !flights.contains_key(s);
            if idle && suspect.domain.as_ref() == Some(domain) {
                suspect.retry_at = Some(retry_due(now, suspect.failures, fastrand::f64()));
                scheduled = true;
            }
        }
        scheduled
    }
}

/// Why an operation is not started.
enum Refusal {
    /// Its subject (or its domain) does not answer.
    Unresponsive(Unresponsive),
    /// Its domain is busy with a slow operation of another subject, or with another retry: its
    /// turn comes later (pending to its caller).
    Busy,
}

impl Refusal {
    fn answer<T>(self) -> Answer<T> {
        match self {
            Refusal::Unresponsive(e) => Answer::Unresponsive(e),
            Refusal::Busy => Answer::Pending,
        }
    }
}

#[derive(Debug, Clone)]
struct Flight {
    id: u64,
    op: &'static str,
    started: Instant,
    deadline: Instant,
    /// Its caller went on without it (pending): until it ends, the subject gets no other
    /// operation, so a volume that stopped answering costs one grace, not one per operation.
    abandoned: bool,
    /// Whether a thread took it up: its deadline counts from then (a job waiting in the queue
    /// behind a wedged disk's thread is not that disk's, nor its own, fault).
    running: bool,
    /// How long it may take once running.
    allowed: Duration,
    /// The filesystem its subject lies on, when known.
    domain: Option<Domain>,
    /// A background retry of an unresponsive subject (one at a time per domain).
    retry: bool,
    /// Its owner watches it (a wipe, see [`Operations::start`]): long but not slow while it
    /// extends its deadline.
    watched: bool,
    /// Another caller was answered `Pending` because of it (the same operation on its subject,
    /// or a slow neighbour on its domain): its end wakes the owner, so that caller asks again.
    /// Without the wake, that subject would wait for an unrelated event or the resync.
    waited_on: bool,
}

impl Flight {
    /// Whether its thread is held: past its deadline, or slow (its caller went on without it,
    /// or it ran past the grace).
    fn held(&self, now: Instant) -> bool {
        self.running
            && (self.deadline <= now || self.abandoned || now.duration_since(self.started) >= GRACE.min(self.allowed))
    }

    /// Whether it is long but answering: a watched operation (a wipe) within its deadline.
    fn long(&self, now: Instant) -> bool {
        self.watched && self.deadline > now
    }
}

/// The threads operations hold, for the pool to add as many beside [`WORKERS`].
#[derive(Debug, Clone, Copy, Default)]
struct Occupied {
    /// Held by long operations that answer (wipes progressing): bounded by their callers
    /// (`--wipe-concurrency`), not by the cap.
    long: usize,
    /// Held by operations that do not answer: past their deadline, or slow and left by their
    /// callers. At most [`WEDGED_CAP`] threads are added for them.
    wedged: usize,
}

#[derive(Debug, Clone)]
struct Suspect {
    op: &'static str,
    /// The filesystem it lies on, when known.
    domain: Option<Domain>,
    /// Made unresponsive by another subject of its domain, not by an operation of its own: a
    /// timely answer on the domain clears it.
    by_neighbour: bool,
    since: Instant,
    failures: u32,
    /// When a background retry may start (after the stuck operation returned).
    retry_at: Option<Instant>,
}

/// An operation registered on its subject; ends (from the thread that did the work) when
/// dropped.
pub struct Ticket {
    inner: Arc<Inner>,
    subject: Subject,
    id: u64,
    /// A retry of a suspect subject: its timely end clears the subject.
    retry: bool,
    /// Its operation was ended already (see [`Ticket::answer`]): dropping it does nothing more.
    ended: bool,
}

impl Ticket {
    /// A thread took the operation up: its deadline counts from now. With `neighbours`, it is
    /// not run (and the refusal is returned) when another subject of its domain got stuck or
    /// slow while it waited in the queue: a wedged filesystem holds one thread, not one per
    /// volume queued in the same pass.
    fn start(&self, neighbours: bool) -> Option<Refusal> {
        let now = Instant::now();
        let mut state = self.inner.lock();
        if neighbours {
            let domain = state.flight(&self.subject, self.id).and_then(|f| f.domain.clone());
            if let Some(refused) = state.held_by_neighbour(&self.subject, domain.as_ref(), now) {
                return Some(refused);
            }
            // Queued before the cap was reached: refused now rather than take an answering thread.
            if !self.retry {
                let held = state.occupied(now).wedged;
                if let Some(refused) = state.over_cap(&self.subject, held, self.inner.cap) {
                    return Some(refused);
                }
            }
        }
        if let Some(f) = state.flight_mut(&self.subject, self.id) {
            f.running = true;
            f.started = now;
            f.deadline = now + f.allowed;
        }
        None
    }

    /// A handle on this operation for its owner.
    pub fn watch(&self) -> Watch {
        Watch { inner: self.inner.clone(), subject: self.subject.clone(), id: self.id }
    }

    /// Hands the answer to its caller, or, when the caller went on without it (or is gone),
    /// keeps it for the next call if it came within the deadline and wakes the owner. Decided
    /// under the lock the caller gives up under, so no answer falls between the two.
    fn answer<T: Send + 'static>(
        mut self,
        op: &'static str,
        tag: String,
        index: usize,
        value: T,
        to: &mpsc::Sender<(usize, Answer<T>)>,
    ) {
        let now = Instant::now();
        let wake = {
            let mut state = self.inner.lock();
            let flight = state.flight(&self.subject, self.id);
            let (abandoned, in_time) = flight.map_or((true, false), |f| (f.abandoned, f.deadline > now));
            let unheard = if abandoned {
                Some(value)
            } else {
                to.send((index, Answer::Done(value))).err().and_then(|e| e.0.1.done())
            };
            let kept = match unheard {
                Some(value) if in_time => {
                    state.kept.insert(self.subject.clone(), Kept { op, tag, at: now, value: Box::new(value) });
                    true
                }
                _ => false,
            };
            // Ended under the same lock: a caller that got this answer and asks again at once
            // finds no operation of the subject still in flight (which would answer it Pending).
            let ended = self.end(&mut state, now);
            self.ended = true;
            kept | ended
        };
        if wake {
            self.inner.wake();
        }
    }

    /// Removes the operation from those in flight and concludes on its subject (and its
    /// domain's neighbours) from how it ended; whether the owner should be woken.
    fn end(&self, state: &mut State, now: Instant) -> bool {
        let flight = state.flights.get_mut(&self.subject).and_then(|v| {
            let at = v.iter().position(|f| f.id == self.id)?;
            Some(v.remove(at))
        });
        if state.flights.get(&self.subject).is_some_and(Vec::is_empty) {
            state.flights.remove(&self.subject);
        }
        let waited_on = flight.as_ref().is_some_and(|f| f.waited_on);
        // Refused before it ran (see `start`): nothing to conclude.
        let Some(flight) = flight.filter(|f| f.running) else { return waited_on };
        let late = flight.deadline <= now;
        let neighbours = state.retry_neighbours(&self.subject, flight.domain.as_ref(), !late, now);
        if late {
            state.answered.remove(&self.subject);
        } else if !state.answered.contains(&self.subject) {
            state.answered.insert(self.subject.clone());
        }
        let others = state.flights.contains_key(&self.subject);
        let concluded = match (late, state.suspects.get_mut(&self.subject)) {
            // A timely answer after the subject stalled: it answers again.
            (false, Some(_)) if self.retry || !others => {
                state.suspects.remove(&self.subject);
                true
            }
            (false, _) => neighbours,
            (true, suspect) => {
                // Too late: the subject stays unresponsive, retried with backoff once
                // nothing of it is stuck any more.
                let failures = suspect.as_ref().map_or(0, |s| s.failures) + 1;
                let since = suspect.as_ref().map_or(flight.started, |s| s.since);
                let retry_at = Some(retry_due(now, failures, fastrand::f64()));
                let domain = flight.domain.clone();
                let suspect = Suspect { op: flight.op, since, failures, retry_at, domain, by_neighbour: false };
                state.suspects.insert(self.subject.clone(), suspect);
                true
            }
        };
        concluded || waited_on
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let wake = {
            let mut state = self.inner.lock();
            self.end(&mut state, Instant::now())
        };
        if wake {
            self.inner.wake();
        }
    }
}

/// How a caller wants an operation run.
pub struct Job<T> {
    /// What it touches.
    pub subject: Subject,
    /// Its name, for reports (`inspect`, `mark`, `probe`...).
    pub op: &'static str,
    /// How long it may take.
    pub deadline: Duration,
    /// The work; run on a pool thread, which hands it the proof ([`OnDeadline`]) the host
    /// calls that may hang ask for.
    pub work: Box<dyn FnOnce(&OnDeadline) -> T + Send>,
    /// Whether it may serve as an unresponsive subject's background retry: a read may; an
    /// effect (a used-mark write) waits until a read proved the subject answers, since nobody
    /// would see its result.
    pub may_retry: bool,
    /// What the work is, beyond its subject and operation (a used mark's PV and identity): a
    /// kept answer is only given to a job with the same tag.
    pub tag: String,
    /// The filesystem its subject lies on, when known (see [`Domain`]).
    pub domain: Option<Domain>,
}

impl<T> Job<T> {
    /// A job.
    pub fn new(
        subject: Subject,
        op: &'static str,
        deadline: Duration,
        work: impl FnOnce(&OnDeadline) -> T + Send + 'static,
    ) -> Self {
        Job { subject, op, deadline, work: Box::new(work), may_retry: true, tag: String::new(), domain: None }
    }

    /// This job on `domain` (see [`Job::domain`]).
    pub fn on(mut self, domain: Option<Domain>) -> Self {
        self.domain = domain;
        self
    }

    /// This job with `tag` (see [`Job::tag`]).
    pub fn tagged(mut self, tag: String) -> Self {
        self.tag = tag;
        self
    }

    /// A job with an effect: never run as a background retry (see [`Job::may_retry`]).
    pub fn effect(
        subject: Subject,
        op: &'static str,
        deadline: Duration,
        work: impl FnOnce(&OnDeadline) -> T + Send + 'static,
    ) -> Self {
        Job { may_retry: false, ..Job::new(subject, op, deadline, work) }
    }
}

impl Operations {
    /// An executor with no wake-up (set one with [`Self::on_wake`]). One per process, made by
    /// the role's entry point (agent::run) and handed to every user in its constructor: each
    /// executor is its own pool with its own view of which subjects are stuck, so a user that
    /// made its own would neither see nor respect the others' wedged disks. No `Default`, so
    /// that a struct deriving it cannot make one unseen.
    #[expect(clippy::new_without_default, reason = "a second executor must be asked for by name")]
    pub fn new() -> Self {
        Self::with_cap(WEDGED_CAP)
    }

    /// An executor adding at most `cap` threads for held ones.
    fn with_cap(cap: usize) -> Self {
        Operations {
            inner: Arc::new(Inner {
                state: Mutex::default(),
                pool: Arc::new(Pool {
                    queue: Mutex::new(PoolState { cap, ..PoolState::default() }),
                    ..Pool::default()
                }),
                wake: Mutex::new(None),
                next_id: AtomicU64::new(1),
                cap,
            }),
        }
    }

    /// Calls `wake` when an unresponsive subject's stuck operation returns or its retry ends.
    pub fn on_wake(&self, wake: impl Fn() + Send + Sync + 'static) {
        *self.inner.wake.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(wake));
    }

    /// Registers an operation on `subject` (lying on `domain`, when known), refused when the
    /// subject is unresponsive: an operation of it is stuck, or it stalled and its retry is not
    /// due (or is running), or an operation of another subject of its domain is stuck or slow.
    /// `Ok((ticket, retry))`: `retry` says the subject is suspect and this is its retry, which
    /// nobody should wait for.
    pub fn begin(
        &self,
        subject: &Subject,
        domain: Option<Domain>,
        op: &'static str,
        deadline: Duration,
    ) -> Result<(Ticket, bool), Unresponsive> {
        let held = self.occupied().wedged;
        self.begin_as(subject, domain, op, deadline, true, held, true).map_err(|refused| match refused {
            Refusal::Unresponsive(e) => e,
            Refusal::Busy => Unresponsive {
                subject: subject.clone(),
                what: "an operation on another volume of its filesystem is slow; tried again once it ends".into(),
            },
        })
    }

    /// [`Self::begin`]; `may_retry` false: refused rather than run as the subject's retry.
    /// `held`: the threads wedged now ([`Occupied::wedged`]), for the cap; `watched`: its owner
    /// watches it (see [`Flight::watched`]).
    #[allow(clippy::too_many_arguments)]
    fn begin_as(
        &self,
        subject: &Subject,
        domain: Option<Domain>,
        op: &'static str,
        deadline: Duration,
        may_retry: bool,
        held: usize,
        watched: bool,
    ) -> Result<(Ticket, bool), Refusal> {
        let now = Instant::now();
        let mut state = self.inner.lock();
        if let Some(stuck) =
            state.flights.get(subject).and_then(|v| v.iter().find(|f| f.running && f.deadline <= now)).cloned()
        {
            let what = stalled_text(state.suspects.get(subject).map_or(stuck.op, |s| s.op));
            state.suspect(subject, stuck.op, stuck.started, stuck.domain);
            return Err(Refusal::Unresponsive(Unresponsive { subject: subject.clone(), what }));
        }
        if let Some(refused) = state.held_by_neighbour(subject, domain.as_ref(), now) {
            return Err(refused);
        }
        let busy = state.flights.contains_key(subject);
        // Retries go one at a time per domain: a wedged filesystem that came back is not asked
        // about all its volumes at once.
        let retrying = state.neighbours(subject, domain.as_ref()).any(|(_, f)| f.retry);
        let retry = match state.suspects.get_mut(subject) {
            None => false,
            Some(s) => match s.retry_at {
                Some(at) if at <= now && !busy && !retrying && may_retry => {
                    s.retry_at = None;
                    true
                }
                _ => {
                    let what = stalled_text(s.op);
                    return Err(Refusal::Unresponsive(Unresponsive { subject: subject.clone(), what }));
                }
            },
        };
        // At the cap, a subject never seen answering could take the answering threads.
        if let Some(refused) = state.over_cap(subject, held, self.inner.cap).filter(|_| !retry) {
            return Err(refused);
        }
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        state.flights.entry(subject.clone()).or_default().push(Flight {
            id,
            op,
            started: now,
            deadline: now + deadline,
            abandoned: false,
            running: false,
            allowed: deadline,
            domain,
            retry,
            watched,
            waited_on: false,
        });
        drop(state);
        Ok((Ticket { inner: self.inner.clone(), subject: subject.clone(), id, retry, ended: false }, retry))
    }

    /// Runs `work` for the registered operation `ticket` on the pool without waiting: the
    /// answer comes on the returned channel. The caller watches the deadline (a long operation
    /// such as a wipe extends it as it progresses, see [`Ticket::watch`]).
    pub fn start<T: Send + 'static>(
        &self,
        ticket: Ticket,
        work: impl FnOnce(&OnDeadline) -> T + Send + 'static,
    ) -> tokio::sync::oneshot::Receiver<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        // The work may drive a child process on the caller's runtime (a wipe's cleaner command).
        let runtime = tokio::runtime::Handle::try_current().ok();
        self.submit(Box::new(move || {
            // Its domain was looked at when it began; a long operation waits for nobody.
            let _ = ticket.start(false);
            let _entered = runtime.as_ref().map(|r| r.enter());
            let value = work(&OnDeadline(()));
            drop(ticket);
            let _ = tx.send(value);
        }));
        rx
    }

    /// Queues `job` on the pool, growing it for the threads held now; while jobs wait behind
    /// held threads, a watcher grows it as more become held, so they get threads even when no
    /// pass comes (a queued job's subject is pending, and asks for nothing new meanwhile).
    fn submit(&self, job: Work) {
        self.inner.pool.submit(self.occupied(), job);
        if !self.inner.pool.watch() {
            return;
        }
        let inner = self.inner.clone();
        let watcher = move || {
            loop {
                std::thread::sleep(QUEUE_LOOK);
                let held = inner.lock().occupied(Instant::now());
                inner.pool.grow(held);
                if inner.pool.unwatch() {
                    return;
                }
            }
        };
        if std::thread::Builder::new().name("host-op-queue".into()).spawn(watcher).is_err() {
            self.inner.pool.unwatch_now();
        }
    }

    /// Runs one operation on the pool and waits for it (see [`Self::run_all`]).
    pub fn run<T: Send + 'static>(
        &self,
        subject: Subject,
        op: &'static str,
        deadline: Duration,
        work: impl FnOnce(&OnDeadline) -> T + Send + 'static,
    ) -> Answer<T> {
        self.run_all(vec![Job::new(subject, op, deadline, work)]).pop().unwrap_or(Answer::Pending)
    }

    /// Runs the jobs concurrently on the pool; one answer per job, in order. Each is waited
    /// for at most [`GRACE`] (or its deadline, when shorter): one still running then is
    /// [`Answer::Pending`], keeps running under its deadline, and its answer is kept for the
    /// next call with the same subject, operation and tag (its end wakes the owner). An
    /// operation of the same kind still running answers `Pending` without a second thread. A
    /// subject's background retry answers [`Answer::Unresponsive`] now.
    pub fn run_all<T: Send + 'static>(&self, jobs: Vec<Job<T>>) -> Vec<Answer<T>> {
        let (tx, rx) = mpsc::channel::<(usize, Answer<T>)>();
        let held = self.occupied().wedged;
        let mut out: Vec<Option<Answer<T>>> = Vec::with_capacity(jobs.len());
        // index -> (subject, op, queued at, deadline, flight id)
        let mut waiting: BTreeMap<usize, (Subject, &'static str, Instant, Duration, u64)> = BTreeMap::new();
        for (i, job) in jobs.into_iter().enumerate() {
            if let Some(value) = self.take_kept::<T>(&job.subject, job.op, &job.tag) {
                out.push(Some(Answer::Done(value)));
                continue;
            }
            if self.running(&job.subject, job.op) {
                out.push(Some(Answer::Pending));
                continue;
            }
            match self.begin_as(&job.subject, job.domain, job.op, job.deadline, job.may_retry, held, false) {
                Err(refused) => out.push(Some(refused.answer())),
                Ok((ticket, retry)) => {
                    let started = Instant::now();
                    let id = ticket.id;
                    let tx = tx.clone();
                    let (work, op, tag) = (job.work, job.op, job.tag.clone());
                    self.submit(Box::new(move || {
                        if let Some(refused) = ticket.start(true) {
                            drop(ticket);
                            let _ = tx.send((i, refused.answer()));
                            return;
                        }
                        let value = work(&OnDeadline(()));
                        // An answer nobody waits for any more is kept for the next pass.
                        ticket.answer(op, tag, i, value, &tx);
                    }));
                    if retry {
                        // Nobody waits for a retry: its answer is kept for the next pass.
                        self.abandon(&job.subject, id);
                        let what = stalled_text(self.stalled_op(&job.subject).unwrap_or(job.op));
                        out.push(Some(Answer::Unresponsive(Unresponsive { subject: job.subject, what })));
                    } else {
                        out.push(None);
                        waiting.insert(i, (job.subject, job.op, started, job.deadline, id));
                    }
                }
            }
        }
        drop(tx);
        // A job is waited for up to the grace (or its deadline, when shorter) from when a thread
        // took it up; one still queued (behind threads held by slow or wedged disks) one grace
        // longer from when it was queued, while the pool grows for it.
        while !waiting.is_empty() {
            let now = Instant::now();
            let flights = self.flights_of(waiting.values().map(|w| (&w.0, w.4)));
            let until = |w: &(Subject, &'static str, Instant, Duration, u64)| match flights.get(&w.4) {
                Some(f) if f.running => f.started + w.3.min(GRACE),
                // Queued: one more grace, in which the pool grows past the threads held.
                _ => w.2 + w.3.min(GRACE) + GRACE,
            };
            // Unstarted jobs are looked at again soon, so the pool grows for them in time.
            let queued = waiting.values().any(|w| !flights.get(&w.4).is_some_and(|f| f.running));
            let next = waiting.values().map(until).min().unwrap_or(now);
            let due = if queued { next.min(now + QUEUE_LOOK) } else { next };
            let received = if due > now { rx.recv_timeout(due - now).ok() } else { rx.try_recv().ok() };
            if let Some((i, answer)) = received {
                if waiting.remove(&i).is_some() {
                    out[i] = Some(answer);
                }
                continue;
            }
            let now = Instant::now();
            let over: Vec<usize> = waiting.iter().filter(|(_, w)| until(w) <= now).map(|(i, _)| *i).collect();
            for i in over {
                let Some((subject, op, _, _, id)) = waiting.remove(&i) else { continue };
                let flight = flights.get(&id);
                out[i] = Some(match flight {
                    Some(f) if f.running && f.deadline <= now => {
                        self.note_overdue(&subject, op, f);
                        let what = stalled_text(self.stalled_op(&subject).unwrap_or(op));
                        Answer::Unresponsive(Unresponsive { subject, what })
                    }
                    _ => {
                        self.abandon(&subject, id);
                        Answer::Pending
                    }
                });
            }
            // Jobs queued behind threads held by slow or wedged disks get threads of their own.
            self.inner.pool.grow(self.occupied());
        }
        // Answers that came in meanwhile are used now rather than kept.
        while let Ok((i, answer)) = rx.try_recv() {
            if matches!(out.get(i), Some(Some(Answer::Pending))) && matches!(answer, Answer::Done(_)) {
                out[i] = Some(answer);
            }
        }
        out.into_iter().map(|o| o.unwrap_or(Answer::Pending)).collect()
    }

    /// [`Self::run_all`] over `jobs` made as they are needed, [`BATCH`] at a time: a pass over
    /// a thousand volumes holds one batch's work and answers at once, not a thousand's.
    pub fn run_each<T: Send + 'static>(&self, jobs: impl IntoIterator<Item = Job<T>>) -> Vec<Answer<T>> {
        let mut jobs = jobs.into_iter().peekable();
        let mut out = Vec::new();
        while jobs.peek().is_some() {
            out.extend(self.run_all(jobs.by_ref().take(BATCH).collect()));
        }
        out
    }

    /// What the executor holds about `subject` now (its operations, its record as unresponsive,
    /// a kept answer, and the operations of other subjects of `domain`), for a log line that
    /// says why a subject's answer is pending.
    pub fn explain(&self, subject: &Subject, domain: Option<&Domain>) -> String {
        let now = Instant::now();
        let state = self.inner.lock();
        let flight = |f: &Flight| {
            format!(
                "{} {}ms ago{}{}{}",
                f.op,
                now.duration_since(f.started).as_millis(),
                if f.running { ", running" } else { ", queued" },
                if f.abandoned { ", abandoned" } else { "" },
                if f.deadline <= now { ", past its deadline" } else { "" }
            )
        };
        let own: Vec<String> = state.flights.get(subject).into_iter().flatten().map(flight).collect();
        let neighbours: Vec<String> =
            state.neighbours(subject, domain).map(|(s, f)| format!("{s}: {}", flight(f))).collect();
        let suspect = state.suspects.get(subject).map(|s| format!("{} (by neighbour {})", s.op, s.by_neighbour));
        let kept = state.kept.get(subject).map(|k| k.op);
        drop(state);
        let pool = self.inner.pool.queue.lock().map(|q| (q.threads, q.idle, q.jobs.len())).unwrap_or_default();
        format!(
            "own {own:?}; neighbours {neighbours:?}; suspect {suspect:?}; kept {kept:?}; pool threads/idle/queued {pool:?}"
        )
    }

    /// Whether an operation `op` on `subject`, or one its caller went on without, is queued or
    /// running within its deadline: then no other starts. A queued one counts whatever its
    /// deadline (which counts only once it runs): each pass queueing another job for a subject
    /// whose first waits behind held threads would grow the queue without end.
    /// Those it finds are marked [`Flight::waited_on`]: their end wakes the owner to ask again.
    fn running(&self, subject: &Subject, op: &'static str) -> bool {
        let now = Instant::now();
        let mut state = self.inner.lock();
        let Some(flights) = state.flights.get_mut(subject) else { return false };
        let mut found = false;
        for f in flights.iter_mut().filter(|f| (f.op == op || f.abandoned) && (!f.running || f.deadline > now)) {
            f.waited_on = true;
            found = true;
        }
        found
    }

    /// Notes that the caller of operation `id` on `subject` went on without it.
    fn abandon(&self, subject: &Subject, id: u64) {
        if let Some(f) = self.inner.lock().flight_mut(subject, id) {
            f.abandoned = true;
        }
    }

    /// The answer kept for (`subject`, `op`, `tag`), taken; answers older than [`KEPT_FOR`]
    /// are dropped on the way.
    fn take_kept<T: 'static>(&self, subject: &Subject, op: &'static str, tag: &str) -> Option<T> {
        let now = Instant::now();
        let mut state = self.inner.lock();
        state.kept.retain(|_, k| now.duration_since(k.at) < KEPT_FOR);
        state.kept.get(subject).filter(|k| k.op == op && k.tag == tag)?;
        let kept = state.kept.remove(subject)?;
        kept.value.downcast::<T>().ok().map(|v| *v)
    }

    /// The operation that first passed its deadline on `subject`, while it is unresponsive.
    fn stalled_op(&self, subject: &Subject) -> Option<&'static str> {
        self.inner.lock().suspects.get(subject).map(|s| s.op)
    }

    /// Records that an operation passed its deadline while its caller waited.
    fn note_overdue(&self, subject: &Subject, op: &'static str, flight: &Flight) {
        self.inner.lock().suspect(subject, op, flight.started, flight.domain.clone());
    }

    /// The unresponsive subjects now, in subject order.
    pub fn stalls(&self) -> Vec<Stall> {
        let now = Instant::now();
        let mut state = self.inner.lock();
        // An operation its caller went on without may have passed its deadline since.
        let overdue: Vec<(Subject, Flight)> = state
            .flights
            .iter()
            .flat_map(|(s, v)| v.iter().filter(|f| f.running && f.deadline <= now).map(move |f| (s.clone(), f.clone())))
            .collect();
        for (subject, f) in overdue {
            state.suspect(&subject, f.op, f.started, f.domain);
        }
        state
            .suspects
            .iter()
            .map(|(subject, s)| Stall {
                subject: subject.clone(),
                op: s.op,
                for_: now.duration_since(s.since),
                // Its own operation, or one of its filesystem's, is still in the kernel.
                stuck: state.flights.get(subject).is_some_and(|v| v.iter().any(|f| f.running && f.deadline <= now))
                    || s.domain.as_ref().is_some_and(|d| {
                        state
                            .flights
                            .values()
                            .flatten()
                            .any(|f| f.domain.as_ref() == Some(d) && f.running && f.deadline <= now)
                    }),
            })
            .collect()
    }

    /// The threads held by operations that do not answer, and the cap on them.
    pub fn held(&self) -> Held {
        Held { threads: self.occupied().wedged, cap: self.inner.cap }
    }

    /// Threads held by operations past their deadline or whose callers went on without them:
    /// the pool adds as many threads for the others (see [`Pool::submit`]).
    fn occupied(&self) -> Occupied {
        self.inner.lock().occupied(Instant::now())
    }

    /// The flights with these ids (on these subjects), as they are now.
    fn flights_of<'a>(&self, ids: impl Iterator<Item = (&'a Subject, u64)>) -> BTreeMap<u64, Flight> {
        let state = self.inner.lock();
        ids.filter_map(|(subject, id)| Some((id, state.flight(subject, id)?.clone()))).collect()
    }

    /// Operations past their deadline whose threads have not returned.
    pub fn stuck(&self) -> usize {
        let now = Instant::now();
        self.inner.lock().flights.values().flatten().filter(|f| f.running && f.deadline <= now).count()
    }

    /// When the next background retry is due, or the next operation in flight passes its
    /// deadline (its subject is then reported), so the owner's loop wakes for it. Only instants
    /// to come: a retry already due runs with the next pass that asks about its subject, and
    /// must not make the loop spin meanwhile.
    pub fn next_retry(&self) -> Option<Instant> {
        let now = Instant::now();
        let state = self.inner.lock();
        let deadlines = state.flights.values().flatten().map(|f| f.deadline);
        state.suspects.values().filter_map(|s| s.retry_at).chain(deadlines).filter(|d| *d > now).min()
    }

    /// Forgets unresponsive subjects that are no longer anybody's (a volume removed), unless
    /// an operation of theirs is still in flight.
    pub fn retain(&self, keep: impl Fn(&Subject) -> bool) {
        let mut state = self.inner.lock();
        let State { flights, suspects, kept, answered } = &mut *state;
        suspects.retain(|s, _| keep(s) || flights.contains_key(s));
        kept.retain(|s, _| keep(s));
        answered.retain(|s| keep(s));
    }

    /// Threads the pool holds now (busy or idle).
    #[cfg(test)]
    pub fn threads(&self) -> usize {
        self.inner.pool.threads()
    }

    /// Operations in flight (queued or running) and jobs waiting in the pool's queue.
    #[cfg(test)]
    fn backlog(&self) -> (usize, usize) {
        let flights = self.inner.lock().flights.values().map(Vec::len).sum();
        (flights, self.inner.pool.queued())
    }
}

impl Inner {
    /// A poisoned lock only means a thread panicked mid-update: the records are still usable.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wake(&self) {
        let wake = self.wake.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(w) = wake {
            w();
        }
    }
}

type Work = Box<dyn FnOnce() + Send>;

/// The threads operations run on: [`WORKERS`] for answering work plus one for each thread an
/// operation that does not answer holds, at most [`WEDGED_CAP`] of them, grown when a job waits
/// and shrunk as soon as the held threads return. Not tokio's blocking pool: a thread stuck in
/// the kernel there would hold up the runtime's shutdown.
#[derive(Default)]
struct Pool {
    queue: Mutex<PoolState>,
    ready: Condvar,
}

#[derive(Default)]
struct PoolState {
    jobs: VecDeque<Work>,
    idle: usize,
    threads: usize,
    /// Threads held by operations, as last counted by the executor.
    held: Occupied,
    /// The most threads added for held ones ([`WEDGED_CAP`]).
    cap: usize,
    /// Whether the held threads were at the cap when last counted (said once per episode).
    at_cap: bool,
    /// Whether a watcher grows the pool for jobs queued (see [`Operations::submit`]).
    watched: bool,
}

impl PoolState {
    /// More threads than the answering work and the held ones need: one free now exits. Else a
    /// pass every 2 s waking one idle thread or another keeps every thread a thaw freed alive.
    fn surplus(&self) -> bool {
        self.jobs.is_empty() && self.threads > WORKERS + self.allowance()
    }

    /// Threads added beside [`WORKERS`] for those held.
    fn allowance(&self) -> usize {
        self.held.long + self.held.wedged.min(self.cap)
    }
}

impl Pool {
    /// Queues `job`; a thread is added when none is free, up to [`WORKERS`] for answering
    /// work plus one for each of the `held` threads operations that do not answer hold, at
    /// most [`WEDGED_CAP`] of those.
    fn submit(self: &Arc<Pool>, held: Occupied, job: Work) {
        {
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            q.jobs.push_back(job);
        }
        self.ready.notify_one();
        self.grow(held);
    }

    /// Adds threads while jobs wait and no thread is free, within the cap of [`Self::submit`].
    fn grow(self: &Arc<Pool>, held: Occupied) {
        loop {
            let spawn = {
                let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
                q.held = held;
                if (held.wedged >= q.cap) != q.at_cap {
                    q.at_cap = held.wedged >= q.cap;
                    let held = held.wedged;
                    if q.at_cap {
                        tracing::warn!(
                            held,
                            "the host-operation threads held by disks that do not answer reached their cap: no thread \
                             is added for more, and volumes not seen answering before are not looked at until some return"
                        );
                    } else {
                        tracing::info!(
                            held,
                            "the host-operation threads held by disks that do not answer are below their cap again"
                        );
                    }
                }
                let spawn = q.jobs.len() > q.idle && q.threads < WORKERS + q.allowance();
                if spawn {
                    q.threads += 1;
                }
                spawn
            };
            if !spawn {
                return;
            }
            let pool = self.clone();
            if std::thread::Builder::new().name("host-op".into()).spawn(move || pool.work()).is_err() {
                let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
                q.threads -= 1;
                return;
            }
        }
    }

    fn work(&self) {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(job) = q.jobs.pop_front() {
                drop(q);
                job();
                q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
                continue;
            }
            if q.surplus() {
                q.threads -= 1;
                return;
            }
            q.idle += 1;
            let (next, timeout) = self.ready.wait_timeout(q, IDLE_EXIT).unwrap_or_else(|e| e.into_inner());
            q = next;
            q.idle -= 1;
            if timeout.timed_out() && q.jobs.is_empty() {
                q.threads -= 1;
                return;
            }
        }
    }

    /// Whether jobs wait with no thread free, the pool may not grow now, and nobody watches
    /// the queue: the caller starts the watcher.
    fn watch(&self) -> bool {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let start = q.jobs.len() > q.idle && q.threads >= WORKERS + q.allowance() && !q.watched;
        q.watched |= start;
        start
    }

    /// Whether the watcher may end: no job waits any more.
    fn unwatch(&self) -> bool {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let done = q.jobs.is_empty();
        q.watched &= !done;
        done
    }

    /// The watcher could not start.
    fn unwatch_now(&self) {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).watched = false;
    }

    #[cfg(test)]
    fn threads(&self) -> usize {
        self.queue.lock().map(|q| q.threads).unwrap_or(0)
    }

    #[cfg(test)]
    fn queued(&self) -> usize {
        self.queue.lock().map(|q| q.jobs.len()).unwrap_or(0)
    }
}

/// A handle on a running operation, for its owner to extend or look at while the work (which
/// holds the [`Ticket`]) runs elsewhere.
#[derive(Clone)]
pub struct Watch {
    inner: Arc<Inner>,
    subject: Subject,
    id: u64,
}

impl Watch {
    /// Moves the operation's deadline to `deadline` from now (it showed progress).
    pub fn extend(&self, deadline: Duration) {
        if let Some(f) = self.inner.lock().flight_mut(&self.subject, self.id) {
            f.deadline = Instant::now() + deadline;
        }
    }

    /// Whether the operation passed its deadline (and has not returned).
    pub fn overdue(&self) -> bool {
        let now = Instant::now();
        let mut state = self.inner.lock();
        let overdue = state.flight(&self.subject, self.id).filter(|f| f.running && f.deadline <= now);
        let Some((op, since, domain)) = overdue.map(|f| (f.op, f.started, f.domain.clone())) else { return false };
        state.suspect(&self.subject, op, since, domain);
        true
    }
}

#[cfg(test)]
#[path = "ops_tests.rs"]
mod tests;
