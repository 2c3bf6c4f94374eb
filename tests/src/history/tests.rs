use super::*;

fn section(worker: &str, fence: u64, start: u64, end: u64) -> Section {
    Section {
        worker: worker.into(),
        key: "k".into(),
        owner: format!("o{fence}"),
        fence,
        start,
        end,
        write: Write::Accepted,
        lost: false,
        hold: Hold::Exclusive,
        seen: None,
    }
}

fn read(worker: &str, fence: u64, start: u64, end: u64) -> Section {
    Section {
        hold: Hold::Read,
        write: Write::Reader,
        ..section(worker, fence, start, end)
    }
}

fn permit(worker: &str, fence: u64, start: u64, end: u64, count: u32, of: u32) -> Section {
    Section {
        hold: Hold::Permits { count, of },
        ..section(worker, fence, start, end)
    }
}

fn snap(fence: u64, done: u64) -> Snapshot {
    Snapshot { fence, done }
}

fn history(sections: Vec<Section>) -> History {
    let mut h = History::new();
    for s in sections {
        h.record(s);
    }
    h
}

#[test]
fn parses_worker_lines() {
    assert_eq!(parse_line("w0", "k", "ready"), Some(Event::Ready));
    assert_eq!(
        parse_line("w0", "k", "cs ab12 17 100 250 0 1"),
        Some(Event::Section(Section {
            write: Write::Rejected,
            lost: true,
            owner: "ab12".into(),
            ..section("w0", 17, 100, 250)
        }))
    );
    assert_eq!(
        parse_line("w0", "k", "err lock Backend 42 redis did not answer"),
        Some(Event::Error {
            op: "lock".into(),
            kind: "Backend".into(),
            at: 42,
        })
    );
    assert_eq!(
        parse_line("w0", "k", "stop-point 9"),
        Some(Event::StopPoint { fence: 9 })
    );
    assert_eq!(parse_line("w0", "k", "cs ab12 17 100"), None);
    assert_eq!(parse_line("w0", "k", "hello"), None);
}

#[test]
fn parses_the_holds_of_the_family() {
    let parsed = |line: &str| match parse_line("w0", "k", line) {
        Some(Event::Section(s)) => s,
        other => panic!("{line}: {other:?}"),
    };
    let s = parsed("cs ab12 17 100 250 r 0 r 5:5/6:6");
    assert_eq!((s.hold, s.write), (Hold::Read, Write::Reader));
    assert_eq!(
        s.seen,
        Some(Seen {
            first: snap(5, 5),
            last: Some(snap(6, 6))
        })
    );
    let s = parsed("cs ab12 17 100 250 r 1 r 5:4");
    assert_eq!(
        s.seen,
        Some(Seen {
            first: snap(5, 4),
            last: None
        })
    );
    assert!(s.lost);
    let s = parsed("cs ab12 17 100 250 h 0 x -");
    assert_eq!(
        (s.hold, s.write, s.seen),
        (Hold::Exclusive, Write::Half, None)
    );
    let s = parsed("cs ab12 17 100 250 1 0 p2/3");
    assert_eq!(s.hold, Hold::Permits { count: 2, of: 3 });
    // what the worker prints parses back
    for hold in [
        Hold::Exclusive,
        Hold::Read,
        Hold::Permits { count: 1, of: 2 },
    ] {
        assert_eq!(Hold::parse(&hold.as_string()), Some(hold));
    }
    let seen = Seen {
        first: snap(1, 0),
        last: Some(snap(2, 2)),
    };
    assert_eq!(Seen::parse(&seen.as_string()), Some(seen));
    for bad in [
        "cs ab12 17 100 250 1 0 q",
        "cs ab12 17 100 250 1 0 p2",
        "cs ab12 17 100 250 r 0 r 5-5",
        "cs ab12 17 100 250 r 0 r 5:5 extra",
    ] {
        assert_eq!(parse_line("w0", "k", bad), None, "{bad}");
    }
}

#[test]
fn readers_may_overlap_readers_but_a_writer_overlaps_nobody() {
    let h = history(vec![
        read("a", 1, 0, 100),
        read("b", 2, 10, 50),      // with a: fine
        section("c", 3, 90, 120),  // a writer while a reads
        section("b", 4, 115, 130), // a writer while c writes
        read("a", 5, 130, 140),    // after both: fine
    ]);
    assert_eq!(h.overlaps().len(), 3);
    assert_eq!(
        h.conflicts(),
        vec![
            Overlap {
                first: 0,
                second: 2
            },
            Overlap {
                first: 2,
                second: 3
            }
        ]
    );
    let clean = history(vec![read("a", 1, 0, 100), read("b", 2, 10, 50)]);
    assert!(clean.conflicts().is_empty());
    assert_eq!(clean.peak(), 2);
}

#[test]
fn a_mutex_conflicts_wherever_it_overlaps_and_two_kinds_on_one_resource_conflict() {
    let h = history(vec![
        section("a", 1, 0, 100),
        section("b", 2, 50, 60),
        section("c", 3, 70, 80),
    ]);
    assert_eq!(h.conflicts(), h.overlaps());
    let mixed = history(vec![read("a", 1, 0, 100), permit("b", 2, 50, 60, 1, 5)]);
    assert_eq!(mixed.conflicts().len(), 1);
}

#[test]
fn at_most_n_permits_at_once() {
    // n = 2: a and b together are fine, c joins them for 20 ns
    let h = history(vec![
        permit("a", 1, 0, 100, 1, 2),
        permit("b", 2, 10, 200, 1, 2),
        permit("c", 3, 80, 150, 1, 2),
        permit("a", 4, 200, 300, 1, 2), // starts as b ends: not open together
    ]);
    assert!(h.conflicts().is_empty(), "permits may overlap");
    assert_eq!(
        h.over_permits(),
        vec![Excess {
            from: 80,
            to: 100,
            held: 3,
            limit: 2,
            sections: vec![0, 1, 2],
        }]
    );
    assert_eq!(h.peak(), 3);
    // within n, also touching at the ends
    let fine = history(vec![
        permit("a", 1, 0, 100, 1, 2),
        permit("b", 2, 10, 200, 1, 2),
        permit("c", 3, 100, 150, 1, 2),
    ]);
    assert!(fine.over_permits().is_empty());
    assert_eq!(fine.peak(), 2);
}

#[test]
fn permits_count_by_their_number_and_the_largest_size_is_the_limit() {
    // acquire_many(2) beside one permit of a semaphore of 2
    let h = history(vec![
        permit("a", 1, 0, 100, 2, 2),
        permit("b", 2, 50, 60, 1, 2),
    ]);
    assert_eq!(h.over_permits().len(), 1);
    assert_eq!(h.over_permits()[0].held, 3);
    // a caller that counts 3 permits may be granted beside two of a caller that counts 2
    let deploy = history(vec![
        permit("a", 1, 0, 100, 2, 2),
        permit("b", 2, 50, 60, 1, 3),
    ]);
    assert!(deploy.over_permits().is_empty());
    // two separate stretches
    let twice = history(vec![
        permit("a", 1, 0, 100, 1, 1),
        permit("b", 2, 50, 60, 1, 1),
        permit("c", 3, 70, 80, 1, 1),
    ]);
    let found = twice.over_permits();
    assert_eq!(found.len(), 2);
    assert_eq!((found[1].from, found[1].to), (70, 80));
    assert_eq!(found[1].sections, vec![0, 2]);
    // a section that ended as it started was never open
    let empty = history(vec![
        permit("a", 1, 0, 100, 1, 1),
        permit("b", 2, 50, 50, 1, 1),
    ]);
    assert!(empty.over_permits().is_empty());
}

#[test]
fn a_reader_that_saw_a_write_in_progress_or_a_write_during_its_hold_saw_a_torn_write() {
    let seen = |first, last| Section {
        seen: Some(Seen { first, last }),
        ..read("r", 9, 0, 10)
    };
    let h = history(vec![
        seen(snap(5, 5), Some(snap(5, 5))), // clean
        seen(snap(0, 0), None),             // nothing written yet, lost before the 2nd look
        seen(snap(6, 5), Some(snap(6, 6))), // the first look caught a write in progress
        seen(snap(6, 6), Some(snap(7, 6))), // the second look did
        seen(snap(6, 6), Some(snap(7, 7))), // a whole write during the hold
        seen(snap(6, 5), None),
    ]);
    assert_eq!(h.torn_reads(), vec![2, 3, 4, 5]);
}

#[test]
fn a_write_refused_halfway_is_a_half_write() {
    let h = history(vec![
        section("a", 1, 0, 10),
        Section {
            write: Write::Half,
            ..section("b", 2, 20, 30)
        },
    ]);
    assert_eq!(h.half_writes(), vec![1]);
    assert!(Write::Half.accepted() && Write::Accepted.accepted());
    assert!(!Write::Rejected.accepted() && !Write::Reader.accepted());
}

#[test]
fn every_grant_has_a_token_of_its_own() {
    let h = history(vec![
        read("a", 5, 0, 10),
        read("b", 5, 5, 10),
        permit("c", 7, 20, 30, 1, 2),
        permit("d", 7, 25, 30, 1, 2),
        permit("e", 7, 40, 50, 1, 2),
    ]);
    // 5 twice: one pair; 7 three times: three pairs
    assert_eq!(h.shared_tokens(), 4);
    assert_eq!(
        history(vec![read("a", 5, 0, 10), read("b", 6, 5, 10)]).shared_tokens(),
        0
    );
}

#[test]
fn a_refusal_is_explained_only_by_a_newer_grant_that_wrote_first() {
    let rejected = |s: Section| Section {
        write: Write::Rejected,
        ..s
    };
    // two permits: b (newer) wrote while a held; a's later write was refused: explained
    let h = history(vec![
        rejected(permit("a", 1, 0, 100, 1, 2)),
        permit("b", 2, 10, 50, 1, 2),
    ]);
    assert!(h.unexplained_rejections().is_empty());
    // refused with no newer grant at all (tokens went backwards, say)
    let h = history(vec![
        permit("a", 5, 0, 100, 1, 2),
        rejected(permit("b", 6, 150, 200, 1, 2)),
    ]);
    assert_eq!(h.unexplained_rejections(), vec![1]);
    // the newer grant came only after the refused section ended: it cannot have written first
    let h = history(vec![
        rejected(section("a", 1, 0, 100)),
        section("b", 2, 100, 150),
    ]);
    assert_eq!(h.unexplained_rejections(), vec![0]);
    // a newer grant whose write was itself refused explains nothing
    let h = history(vec![
        rejected(section("a", 1, 0, 100)),
        rejected(section("b", 2, 10, 50)),
    ]);
    assert_eq!(h.unexplained_rejections(), vec![0, 1]);
}

#[test]
fn sections_one_after_another_do_not_overlap() {
    let mut h = History::new();
    h.record(section("a", 1, 0, 10));
    h.record(section("b", 2, 10, 20));
    h.record(section("a", 3, 25, 30));
    assert!(h.overlaps().is_empty());
    assert_eq!(h.fence_inversions(), 0);
}

#[test]
fn finds_every_overlapping_pair() {
    let mut h = History::new();
    h.record(section("a", 1, 0, 100)); // a paused holder
    h.record(section("b", 2, 50, 60));
    h.record(section("c", 3, 70, 80));
    h.record(section("b", 4, 120, 130));
    let pairs = h.overlaps();
    assert_eq!(
        pairs,
        vec![
            Overlap {
                first: 0,
                second: 1
            },
            Overlap {
                first: 0,
                second: 2
            }
        ]
    );
}

#[test]
fn different_lock_keys_on_one_resource_still_overlap() {
    let mut h = History::new();
    h.record(section("a", 5, 0, 10));
    h.record(Section {
        key: "other".into(),
        ..section("b", 7, 5, 15)
    });
    assert_eq!(h.overlaps().len(), 1);
}

#[test]
fn counts_tokens_that_did_not_increase_with_the_grants() {
    let mut h = History::new();
    h.record(section("a", 5, 0, 10));
    h.record(section("b", 3, 20, 30));
    h.record(section("c", 6, 40, 50));
    assert_eq!(h.fence_inversions(), 1);
}

#[test]
fn tokens_order_the_grants_that_exclude_each_other() {
    // a read share granted first (token 5) whose reply came late, after a share granted
    // later (token 6) had come and gone: no inversion
    let shares = history(vec![read("a", 5, 100, 110), read("b", 6, 20, 30)]);
    assert_eq!(shares.fence_inversions(), 0);
    let permits = history(vec![
        permit("a", 5, 100, 110, 1, 2),
        permit("b", 6, 20, 30, 1, 2),
    ]);
    assert_eq!(permits.fence_inversions(), 0);
    // a writer and a reader exclude each other: their tokens follow their sections
    let h = history(vec![
        read("a", 5, 100, 110),
        section("b", 6, 20, 30),
        section("c", 4, 200, 210),
    ]);
    // b (6) before a (5), b (6) and a (5) before c (4)
    assert_eq!(h.fence_inversions(), 3);
}

#[test]
fn recovery_is_the_first_grant_after_a_fault() {
    let mut h = History::new();
    h.record(section("a", 1, 0, 10));
    h.record(section("b", 2, 500, 510));
    h.record(section("a", 3, 700, 710));
    assert_eq!(h.first_grant_after(100, None), Some(400));
    assert_eq!(h.first_grant_after(100, Some("a")), Some(600));
    assert_eq!(h.first_grant_after(800, None), None);
    assert_eq!(h.first_grant_to_others_after(100, "b"), Some(600));
    assert_eq!(h.grants_after(100), 2);
}

#[test]
fn bypass_counts_grants_to_others_between_two_grants_of_one_worker() {
    let mut h = History::new();
    for (i, w) in ["a", "b", "c", "a", "b", "b", "b", "a", "c"]
        .iter()
        .enumerate()
    {
        let t = i as u64 * 10;
        h.record(section(w, i as u64 + 1, t, t + 5));
    }
    assert_eq!(
        h.longest_bypass(),
        Some(Bypass {
            worker: "c".into(),
            others: 5,
            waited: Duration::from_nanos(60)
        })
    );
}

#[test]
fn bypass_after_a_fault_counts_from_when_every_worker_is_back() {
    let mut h = History::new();
    // c is slow to come back after the fault at 25: a and b take 6 grants meanwhile
    for (i, w) in ["a", "b", "c", "a", "b", "a", "b", "a", "b", "c", "a", "c"]
        .iter()
        .enumerate()
    {
        let t = i as u64 * 10;
        h.record(section(w, i as u64 + 1, t, t + 5));
    }
    assert_eq!(h.longest_bypass().unwrap().others, 6);
    let back = h.all_back_after(25).unwrap();
    assert_eq!(back, 90, "c's first grant after the fault");
    let after = h.longest_bypass_after(back).unwrap();
    assert_eq!((after.worker.as_str(), after.others), ("c", 1));
    assert_eq!(h.all_back_after(115), None, "nobody was granted after 115");
}

#[test]
fn resource_log_counts_stale_writes() {
    let log: Vec<LogEntry> = ["3 a 1", "5 b 1", "4 a 0", "4 c 1", "9 b 1"]
        .iter()
        .map(|l| LogEntry::parse(l).unwrap())
        .collect();
    assert_eq!(
        ResourceCheck::of(&log),
        ResourceCheck {
            accepted: 4,
            stale_accepted: 1,
            stale_rejected: 1
        }
    );
}

#[test]
fn table_has_one_line_per_row_and_aligned_columns() {
    let row = Row {
        scenario: "single".into(),
        faults: "DEBUG SLEEP x3".into(),
        grants: 42,
        errors: BTreeMap::from([("lock Backend".to_owned(), 2)]),
        recovery: Some((Some(Duration::from_millis(12)), 3)),
        ..Row::default()
    };
    let t = table(&[row]);
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(lines.len(), 3);
    assert!(lines[2].contains("lock Backend 2"));
    assert_eq!(lines[0].matches('|').count(), COLUMNS + 1);
    assert!(lines[2].contains("max 12.0 ms (3 faults)"));
    assert!(lines.iter().all(|l| l.len() == lines[0].len()));
}
