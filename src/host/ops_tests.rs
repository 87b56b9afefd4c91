use super::*;
use std::sync::atomic::AtomicBool;

/// A host call that never returns until released: a syscall stuck on a frozen filesystem.
#[derive(Clone, Default)]
struct Wedge(Arc<AtomicBool>);

impl Wedge {
    fn hold(&self) {
        while !self.0.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    fn release(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

fn vol(p: &str) -> Subject {
    Subject::Volume(p.to_string())
}

/// Counts the owner's wake-ups.
fn count_wakes(ops: &Operations) -> Arc<AtomicU64> {
    let woken = Arc::new(AtomicU64::new(0));
    let count = woken.clone();
    ops.on_wake(move || {
        count.fetch_add(1, Ordering::SeqCst);
    });
    woken
}

const SHORT: Duration = Duration::from_millis(150);

#[test]
fn a_wedged_subject_costs_its_deadline_once_and_never_the_others() {
    let ops = Operations::new();
    let wedge = Wedge::default();
    let w = wedge.clone();
    let jobs = vec![
        Job::new(vol("/a"), "inspection", SHORT, |_| 1),
        Job::new(vol("/wedged"), "inspection", SHORT, move |_| {
            w.hold();
            2
        }),
        Job::new(vol("/b"), "inspection", SHORT, |_| 3),
    ];
    let started = Instant::now();
    let out = ops.run_all(jobs);
    assert!(started.elapsed() >= SHORT && started.elapsed() < SHORT * 4);
    assert_eq!(out[0], Answer::Done(1));
    assert!(
        matches!(&out[1], Answer::Unresponsive(e) if e.subject == vol("/wedged") && e.what.contains("did not answer within its deadline"))
    );
    assert_eq!(out[2], Answer::Done(3));
    assert_eq!(ops.stuck(), 1);
    // The next pass: refused at once, without a thread, for every kind of operation.
    let threads = ops.threads();
    let started = Instant::now();
    let again = ops.run(vol("/wedged"), "used mark write", SHORT, |_| 9);
    assert!(started.elapsed() < SHORT / 2, "no wait for a subject known to be stuck");
    assert!(
        matches!(&again, Answer::Unresponsive(e) if e.what.contains("its inspection did not answer")),
        "named after the first stalled operation"
    );
    assert!(ops.threads() <= threads, "no new thread for a stuck subject");
    assert_eq!(ops.run(vol("/a"), "inspection", SHORT, |_| 4), Answer::Done(4));
    let stalls = ops.stalls();
    assert_eq!(stalls.len(), 1);
    assert!(stalls[0].stuck && stalls[0].op == "inspection");
    wedge.release();
}

#[test]
fn a_subject_that_answers_again_is_retried_in_the_background_then_cleared() {
    let ops = Operations::new();
    let woken = count_wakes(&ops);
    let wedge = Wedge::default();
    let w = wedge.clone();
    assert!(ops.run(vol("/v"), "inspection", SHORT, move |_| w.hold()).done().is_none());
    wedge.release();
    // The stuck call returns (too late): the owner is woken and a retry is due after 1 s.
    let deadline = Instant::now() + Duration::from_secs(5);
    while ops.stuck() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(ops.stuck(), 0);
    assert!(woken.load(Ordering::SeqCst) >= 1, "a returning stuck call wakes the owner");
    let retry_at = ops.next_retry().expect("a retry is scheduled");
    assert!(ops.run(vol("/v"), "inspection", SHORT, |_| ()).done().is_none(), "before its retry: still refused");
    std::thread::sleep(retry_at.saturating_duration_since(Instant::now()));
    // The retry runs in the background (nobody waits for it) and clears the subject.
    assert!(
        matches!(ops.run(vol("/v"), "inspection", SHORT, |_| ()), Answer::Unresponsive(e) if e.what.contains("did not answer"))
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while !ops.stalls().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(ops.stalls().is_empty(), "a timely answer clears the subject");
    assert_eq!(ops.run(vol("/v"), "inspection", SHORT, |_| 7), Answer::Done(7));
}

#[test]
fn a_slow_subject_stays_unresponsive_with_growing_delays() {
    let ops = Operations::new();
    assert!(
        ops.run(vol("/slow"), "probe", Duration::from_millis(20), |_| std::thread::sleep(Duration::from_millis(60)))
            .done()
            .is_none()
    );
    std::thread::sleep(Duration::from_millis(80));
    let first = ops.next_retry().expect("retry scheduled");
    std::thread::sleep(first.saturating_duration_since(Instant::now()));
    // The retry is as slow: it ends late, and the next delay is longer.
    let _ =
        ops.run(vol("/slow"), "probe", Duration::from_millis(20), |_| std::thread::sleep(Duration::from_millis(60)));
    std::thread::sleep(Duration::from_millis(100));
    let second = ops.next_retry().expect("retry scheduled again");
    assert!(second.saturating_duration_since(Instant::now()) > Duration::from_millis(1500));
    assert_eq!(ops.stalls().len(), 1);
    ops.retain(|_| false);
    assert!(ops.stalls().is_empty(), "a subject nobody has any more is forgotten");
}

#[test]
fn the_pool_is_bounded_and_a_long_operation_extends_its_deadline() {
    let ops = Operations::with_cap(8);
    let wedge = Wedge::default();
    let jobs: Vec<Job<()>> = (0..16)
        .map(|i| {
            let w = wedge.clone();
            Job::new(vol(&format!("/v{i}")), "inspection", Duration::from_millis(100), move |_| w.hold())
        })
        .collect();
    let out = ops.run_all(jobs);
    assert!(out.iter().all(|a| !matches!(a, Answer::Done(_))));
    assert!(ops.threads() <= WORKERS + 8, "{} threads", ops.threads());
    wedge.release();
    // A wipe's deadline moves while it progresses.
    let (ticket, retry) = ops.begin(&vol("/w"), None, "wipe", Duration::from_millis(50)).unwrap();
    assert!(!retry);
    assert!(ticket.start(false).is_none());
    let watch = ticket.watch();
    std::thread::sleep(Duration::from_millis(30));
    watch.extend(Duration::from_millis(50));
    std::thread::sleep(Duration::from_millis(30));
    assert!(!watch.overdue());
    std::thread::sleep(Duration::from_millis(40));
    assert!(watch.overdue());
    assert!(ops.begin(&vol("/w"), None, "inspection", SHORT).is_err(), "a stuck wipe keeps others off its volume");
    drop(ticket);
    assert_eq!(ops.stuck(), 0);
}

/// The real node's lost volumes: a pass got an entry's answer, the next pass (at once, the
/// events of a mount queued meanwhile) found the finished operation still registered, was
/// answered Pending, and nothing woke the loop again. An answered operation is over for
/// whoever asks next, however the pool's thread is scheduled after handing it over.
#[test]
fn an_answered_operation_is_never_still_in_flight_for_the_next_call() {
    let ops = Operations::new();
    for i in 0..2000 {
        let jobs = vec![
            Job::new(vol("/a"), "inspection", SHORT, move |_| i),
            Job::new(vol("/b"), "inspection", SHORT, move |_| i + 1),
        ];
        assert_eq!(ops.run_all(jobs), vec![Answer::Done(i), Answer::Done(i + 1)], "round {i}");
    }
}

/// A caller answered Pending because the same operation of its subject was running for
/// another caller is woken when that one ends, so it asks again: a Pending nobody wakes
/// would leave the subject unexamined until an unrelated event.
#[test]
fn a_caller_answered_pending_for_another_callers_operation_is_woken_when_it_ends() {
    let ops = Operations::new();
    let woken = count_wakes(&ops);
    let first = {
        let ops = ops.clone();
        std::thread::spawn(move || {
            ops.run(vol("/v"), "inspection", GRACE * 4, |_| {
                std::thread::sleep(GRACE / 2);
                "first"
            })
        })
    };
    std::thread::sleep(GRACE / 5);
    assert_eq!(ops.run(vol("/v"), "inspection", GRACE * 4, |_| "second"), Answer::Pending);
    assert_eq!(first.join().unwrap(), Answer::Done("first"), "its own caller still gets it");
    assert!(woken.load(Ordering::SeqCst) >= 1, "the end of the operation it waited on wakes the owner");
    assert_eq!(ops.run(vol("/v"), "inspection", GRACE, |_| "again"), Answer::Done("again"));
}

#[test]
fn a_slow_answer_is_not_waited_for_past_the_grace_and_is_kept_for_the_next_pass() {
    let ops = Operations::new();
    let woken = count_wakes(&ops);
    let ran = Arc::new(AtomicU64::new(0));
    let slow = |ran: Arc<AtomicU64>| {
        move |_: &OnDeadline| {
            ran.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(GRACE + Duration::from_millis(300));
            "surface read"
        }
    };
    let deadline = GRACE * 5;
    let started = Instant::now();
    let jobs = vec![
        Job::new(vol("/hdd"), "probe", deadline, slow(ran.clone())),
        Job::new(vol("/ssd"), "probe", deadline, |_| "fast"),
    ];
    let out = ops.run_all(jobs);
    assert!(started.elapsed() < GRACE + Duration::from_millis(200), "waited only the grace");
    assert_eq!(out, vec![Answer::Pending, Answer::Done("fast")]);
    // Asked again while it runs: pending, no second read.
    assert_eq!(ops.run(vol("/hdd"), "probe", deadline, slow(ran.clone())), Answer::Pending);
    std::thread::sleep(Duration::from_millis(500));
    assert!(woken.load(Ordering::SeqCst) >= 1, "its end wakes the owner");
    // The next pass gets the kept answer at once, without reading again.
    let started = Instant::now();
    assert_eq!(ops.run(vol("/hdd"), "probe", deadline, slow(ran.clone())), Answer::Done("surface read"));
    assert!(started.elapsed() < Duration::from_millis(100));
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert!(ops.stalls().is_empty(), "slow but within its deadline: not unresponsive");
    // A kept answer goes only to the same work (tag).
    let _ = ops.run_all(vec![Job::new(vol("/t"), "mark", deadline, slow(ran.clone())).tagged("pv-1".into())]);
    std::thread::sleep(Duration::from_millis(500));
    let other = ops.run_all(vec![Job::new(vol("/t"), "mark", deadline, |_| "fresh").tagged("pv-2".into())]);
    assert_eq!(other, vec![Answer::Done("fresh")]);
}

#[test]
fn jobs_queued_behind_wedged_threads_get_threads_of_their_own() {
    let ops = Operations::new();
    let wedge = Wedge::default();
    let deadline = Duration::from_secs(30);
    let mut jobs: Vec<Job<u32>> = (0..WORKERS)
        .map(|i| {
            let w = wedge.clone();
            Job::new(vol(&format!("/wedged{i}")), "inspection", deadline, move |_| {
                w.hold();
                0
            })
        })
        .collect();
    jobs.extend((0..6).map(|i| Job::new(vol(&format!("/ok{i}")), "inspection", deadline, move |_| i + 1)));
    let first = ops.run_all(jobs);
    assert!(first.iter().take(WORKERS).all(|a| *a == Answer::Pending));
    std::thread::sleep(Duration::from_millis(300));
    let again: Vec<Job<u32>> =
        (0..6).map(|i| Job::new(vol(&format!("/ok{i}")), "inspection", deadline, |_| 99)).collect();
    let answers = ops.run_all(again);
    // Each healthy job answered in the first call, or later and was kept for the second.
    for (i, (a, b)) in first.iter().skip(WORKERS).zip(&answers).enumerate() {
        let want = i as u32 + 1;
        assert!(*a == Answer::Done(want) || *b == Answer::Done(want), "job {want}: {a:?} then {b:?}");
    }
    assert!(ops.stalls().is_empty(), "nothing healthy counts as unresponsive");
    wedge.release();
}

/// Polls `done` every few milliseconds for up to 10 s.
fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `n` jobs on subjects `{prefix}{i}` that block until `wedge` is released.
fn wedged_jobs(prefix: &str, n: usize, wedge: &Wedge, deadline: Duration) -> Vec<Job<u32>> {
    (0..n)
        .map(|i| {
            let w = wedge.clone();
            Job::new(vol(&format!("{prefix}{i}")), "inspection", deadline, move |_| {
                w.hold();
                0
            })
        })
        .collect()
}

#[test]
fn healthy_work_gets_a_thread_whatever_the_number_of_wedged_subjects() {
    // More wedged subjects than the old pool's 64 threads in all.
    let ops = Operations::new();
    let wedge = Wedge::default();
    let _ = ops.run_all(wedged_jobs("/wedged", 100, &wedge, Duration::from_millis(100)));
    until("every wedged job to hold its thread", || ops.held().threads == 100);
    assert!(!ops.held().cap_reached());
    let started = Instant::now();
    assert_eq!(ops.run(vol("/ok"), "inspection", SHORT, |_| 7), Answer::Done(7));
    assert!(started.elapsed() < SHORT, "a healthy volume waited {:?}", started.elapsed());
    assert!(ops.threads() <= WORKERS + 100, "{} threads", ops.threads());
    wedge.release();
}

#[test]
fn at_the_cap_of_wedged_threads_it_is_reported_and_answering_subjects_still_run() {
    let ops = Operations::with_cap(4);
    // Volumes seen answering before.
    for i in 0..3 {
        assert_eq!(ops.run(vol(&format!("/known{i}")), "inspection", SHORT, |_| 1), Answer::Done(1));
    }
    let wedge = Wedge::default();
    let out = ops.run_all(wedged_jobs("/wedged", 8, &wedge, Duration::from_millis(100)));
    assert!(out.iter().all(|a| !matches!(a, Answer::Done(_))));
    // Jobs queued before the cap was reached are refused when their turn comes, not run on
    // the answering thread.
    until("the queue to drain at the cap", || ops.backlog().1 == 0 && ops.held().cap_reached());
    let held = ops.held();
    assert_eq!((held.threads, held.cap), (4, 4));
    assert!(ops.threads() <= WORKERS + 4, "{} threads", ops.threads());
    // A subject never seen answering is refused at once, saying why...
    let started = Instant::now();
    let refused = ops.run(vol("/new"), "inspection", SHORT, |_| 2);
    assert!(matches!(&refused, Answer::Unresponsive(e) if e.what.contains("cap")), "{refused:?}");
    assert!(started.elapsed() < SHORT / 2);
    // ...and those that answered still get the answering thread.
    for i in 0..3 {
        assert_eq!(ops.run(vol(&format!("/known{i}")), "inspection", SHORT, |_| 3), Answer::Done(3));
    }
    wedge.release();
    until("the held threads to return", || !ops.held().cap_reached());
    assert_eq!(ops.run(vol("/new"), "inspection", SHORT, |_| 4), Answer::Done(4));
}

#[test]
fn subjects_sharing_a_wedged_filesystem_cost_one_thread() {
    let ops = Operations::new();
    let wedge = Wedge::default();
    let frozen = Domain::filesystem("7:1");
    let deadline = Duration::from_millis(200);
    let on_frozen = |wedge: &Wedge| {
        let jobs = wedged_jobs("/frozen", 20, wedge, deadline);
        jobs.into_iter().map(|j| j.on(Some(frozen.clone()))).collect::<Vec<_>>()
    };
    let first = ops.run_all(on_frozen(&wedge));
    assert!(first.iter().all(|a| !matches!(a, Answer::Done(_))));
    until("the frozen filesystem's operation to pass its deadline", || ops.stuck() == 1);
    // Passes keep asking: refused at once, no thread more.
    for _ in 0..5 {
        let started = Instant::now();
        let again = ops.run_all(on_frozen(&wedge));
        assert!(started.elapsed() < SHORT, "refused at once");
        assert!(again.iter().all(|a| matches!(a, Answer::Unresponsive(_))), "{again:?}");
        assert!(
            again.iter().skip(1).all(|a| matches!(a, Answer::Unresponsive(e) if e.what.contains("filesystem 7:1")))
        );
    }
    assert_eq!(ops.held().threads, 1, "one thread for the whole filesystem");
    let stalls = ops.stalls();
    assert_eq!(stalls.len(), 20, "every volume of the filesystem is reported: {stalls:?}");
    assert!(stalls.iter().all(|s| s.stuck));
    assert!(ops.threads() <= WORKERS + 1, "{} threads", ops.threads());
    // Another filesystem, and a volume of no known filesystem, are not concerned.
    let other = Job::new(vol("/other"), "inspection", SHORT, |_| 5).on(Some(Domain::filesystem("7:2")));
    let plain = Job::new(vol("/plain"), "inspection", SHORT, |_| 6);
    assert_eq!(ops.run_all(vec![other, plain]), vec![Answer::Done(5), Answer::Done(6)]);
    // Thawed: the stuck one returns (too late). The first retry on the filesystem that
    // answers in time clears the volumes that were unresponsive only because of it.
    wedge.release();
    until("the stuck operation to return", || ops.stuck() == 0);
    let thawed = || -> Vec<Job<u32>> {
        (0..20)
            .map(|i| Job::new(vol(&format!("/frozen{i}")), "inspection", SHORT, |_| 8).on(Some(frozen.clone())))
            .collect()
    };
    until("the filesystem's volumes to answer again", || ops.run_all(thawed()).iter().all(|a| *a == Answer::Done(8)));
    assert!(ops.stalls().is_empty());
}

#[test]
fn passes_against_a_saturated_pool_queue_nothing_twice() {
    // Every thread held: the answering one too (a volume that answered before wedged).
    let ops = Operations::with_cap(2);
    for i in 0..13 {
        assert_eq!(ops.run(vol(&format!("/v{i}")), "inspection", SHORT, |_| 0), Answer::Done(0));
    }
    let wedge = Wedge::default();
    let _ = ops.run_all(wedged_jobs("/v", 3, &wedge, Duration::from_millis(50)));
    until("every thread to be held", || ops.held().threads == 3 && ops.threads() == 3);
    // Passes over the other volumes, each job's deadline passing while it waits queued.
    let pass = || {
        let jobs: Vec<Job<u32>> =
            (3..13).map(|i| Job::new(vol(&format!("/v{i}")), "inspection", Duration::from_millis(10), |_| 1)).collect();
        ops.run_all(jobs)
    };
    for _ in 0..50 {
        assert!(pass().iter().all(|a| *a == Answer::Pending));
        let (flights, queued) = ops.backlog();
        assert!(flights <= 13 && queued <= 10, "{flights} flights, {queued} queued");
    }
    wedge.release();
    until("the queued jobs to run", || ops.backlog() == (0, 0));
}

#[test]
fn threads_freed_by_a_thaw_exit_while_passes_go_on() {
    let ops = Operations::new();
    let wedge = Wedge::default();
    let _ = ops.run_all(wedged_jobs("/wedged", 8, &wedge, Duration::from_millis(100)));
    until("every wedged job to hold its thread", || ops.held().threads == 8);
    assert!(ops.threads() > WORKERS + 4);
    wedge.release();
    until("the wedged operations to return", || ops.stuck() == 0);
    // Passes every few milliseconds wake idle threads before IDLE_EXIT would end them.
    let started = Instant::now();
    let mut n = 0u32;
    while ops.threads() > WORKERS + 1 {
        assert!(started.elapsed() < IDLE_EXIT / 2, "{} threads after {:?}", ops.threads(), started.elapsed());
        let jobs: Vec<Job<u32>> =
            (0..4).map(|i| Job::new(vol(&format!("/ok{i}")), "inspection", SHORT, move |_| i)).collect();
        assert_eq!(ops.run_all(jobs), (0..4).map(Answer::Done).collect::<Vec<_>>());
        n += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(n < 50, "{n} passes");
}

#[test]
fn a_long_wipe_that_progresses_is_not_wedged_and_keeps_nobody_waiting() {
    let ops = Operations::new();
    let disk = Domain::filesystem("8:16");
    let wedge = Wedge::default();
    let w = wedge.clone();
    let (ticket, _) = ops.begin(&vol("/disk/a"), Some(disk.clone()), "wipe", Duration::from_secs(30)).unwrap();
    let done = ops.start(ticket, move |_| w.hold());
    std::thread::sleep(GRACE + Duration::from_millis(100));
    assert_eq!(ops.held().threads, 0, "a wipe within its deadline is not counted as wedged");
    // Its neighbours on the same filesystem, and the others, get threads as usual.
    let neighbour = Job::new(vol("/disk/b"), "inspection", SHORT, |_| 1).on(Some(disk));
    let other = Job::new(vol("/other"), "inspection", SHORT, |_| 2);
    assert_eq!(ops.run_all(vec![neighbour, other]), vec![Answer::Done(1), Answer::Done(2)]);
    wedge.release();
    until("the wipe to end", || ops.backlog().0 == 0);
    drop(done);
}
