//! Zero heap allocations on the audio thread's side of the ensemble clock, proven with the
//! counting allocator: reading the shared segment and mapping local to ensemble time,
//! while the clock keeps publishing; taking due timed messages from an audio inbox while
//! the network thread keeps handing them over; and none per exchange in the client once
//! built.

use netjam_ensemble::clock::{clock_share, ClockClient, ClockConfig, ClockSegment, ClockServer};

alloc_count::install!();

#[test]
fn reading_ensemble_time_does_not_allocate() {
    let (mut publisher, reader) = clock_share();
    publisher.publish(ClockSegment {
        local_origin_ns: 1_000,
        ensemble_origin_ns: 5_000_000_000,
        rate: -150e-6,
    });
    let audio = std::thread::spawn(move || {
        let before = alloc_count::allocations();
        alloc_count::prove_counting();
        let mut last = 0u64;
        let mut read = 0u64;
        for k in 0..200_000u64 {
            // Stand-in for one audio period's local time.
            if let Some(e) = reader.ensemble_ns(1_000 + k * 1_333_333) {
                assert!(e >= last, "ensemble time went back");
                last = e;
                read += 1;
            }
        }
        (alloc_count::allocations() - before - 1, read)
    });
    for k in 0..2_000u64 {
        publisher.publish(ClockSegment {
            local_origin_ns: 1_000,
            ensemble_origin_ns: 5_000_000_000,
            rate: -150e-6 + k as f64 * 1e-9,
        });
    }
    let (allocs, read) = audio.join().expect("audio thread");
    assert_eq!(allocs, 0, "the audio thread allocated");
    assert!(read > 0);
}

#[test]
fn the_client_does_not_allocate_per_exchange() {
    let mut client = ClockClient::new(ClockConfig::default());
    let mut server = ClockServer::new();
    let mut buf = [0u8; 64];
    let ms = 1_000_000u64;
    let mut measured = None;
    for k in 0..3_000u64 {
        let now = k * 100 * ms;
        if k == 1_000 {
            // The window (512 exchanges) is full by now.
            measured = Some(alloc_count::allocations());
            alloc_count::prove_counting();
        }
        let req = client.poll_transmit(now).expect("a probe every interval");
        let n = req.encode(&mut buf).expect("encode");
        let req = netjam_ensemble::clock::ProbeRequest::decode(&buf[..n]).expect("decode");
        let rep = server.answer(7_000 * ms + now + 19 * ms + (k % 7) * ms, &req);
        let n = rep.encode(&mut buf).expect("encode");
        let rep = netjam_ensemble::clock::ProbeReply::decode(&buf[..n]).expect("decode");
        assert!(client.handle_reply(now + 38 * ms + (k % 5) * ms, &rep));
        assert_eq!(client.ensemble_time(now + 40 * ms).is_some(), k >= 4);
    }
    let before = measured.expect("measured");
    assert_eq!(
        alloc_count::allocations() - before - 1,
        0,
        "the client allocated per exchange"
    );
}

#[test]
fn taking_due_timed_messages_does_not_allocate() {
    use netjam_ensemble::inbox::audio_inbox;
    const N: u64 = 5_000;
    let (mut tx, mut rx) = audio_inbox(N as usize, 64);
    let period = 1_333_333u64;
    let audio = std::thread::spawn(move || {
        let before = alloc_count::allocations();
        alloc_count::prove_counting();
        let mut taken = 0u64;
        let mut late = 0u64;
        let mut start = 0u64;
        // Stand-in audio periods in ensemble time, until every message was taken.
        for _ in 0..2_000_000u64 {
            rx.take_period(start, period, 64, |frame, t, m| {
                taken += 1;
                if t > start + period || frame >= 64 || m.is_empty() {
                    late += 1;
                }
            });
            if taken == N {
                break;
            }
            start += period / 8;
        }
        (alloc_count::allocations() - before - 1, taken, late)
    });
    let mut msg = [0u8; 16];
    let n = netjam_osc::encode_message(&mut msg, "/s/go", &[netjam_osc::Arg::Int(1)]).expect("encode");
    let mut sent = 0u64;
    while sent < N {
        // Times spread over the next few hundred periods; a full queue is retried.
        if tx.send(1 + sent * 50_000, &msg[..n]).is_ok() {
            sent += 1;
        } else {
            std::thread::yield_now();
        }
    }
    let (allocs, taken, late) = audio.join().expect("audio thread");
    assert_eq!(allocs, 0, "the audio thread allocated");
    assert_eq!((taken, late), (N, 0));
}

#[test]
fn reading_the_beat_and_rendering_clicks_does_not_allocate() {
    use netjam_ensemble::beat::{tempo_share, ClickTrack, TempoSegment, TempoView};
    let (mut publisher, reader) = tempo_share();
    let seg = |start_ns: u64, start_beat: f64, bpm: f64| TempoSegment {
        start_ns,
        start_beat,
        bpm,
        by: 1,
    };
    publisher.publish(TempoView {
        current: Some(seg(0, 0.0, 120.0)),
        next: Some(seg(2_000_000_000, 4.0, 150.0)),
    });
    let mut clicks = ClickTrack::new(48_000, 0.5, 4);
    let mut out = vec![0f32; 64 * 2];
    let audio = std::thread::spawn(move || {
        let before = alloc_count::allocations();
        alloc_count::prove_counting();
        let mut onsets = 0u64;
        // 10 s of 64-frame periods at 48 kHz.
        for p in 0..7_500u64 {
            let start = p * 64 * 1_000_000_000 / 48_000;
            out.fill(0.0);
            if let Some(view) = reader.view() {
                clicks.render(&view, start, 64, 2, &mut out, |_| onsets += 1);
            }
        }
        (alloc_count::allocations() - before - 1, onsets)
    });
    for k in 0..2_000u64 {
        publisher.publish(TempoView {
            current: Some(seg(0, 0.0, 120.0)),
            next: Some(seg(2_000_000_000, 4.0, 150.0 + (k % 2) as f64)),
        });
    }
    let (allocs, onsets) = audio.join().expect("audio thread");
    assert_eq!(allocs, 0, "the audio thread allocated");
    // 4 beats at 120 BPM, then about 20 at 150 BPM.
    assert!((20..=26).contains(&onsets), "{onsets} clicks");
}
