//! Channel maps run on the audio thread: gathering the chosen inputs of a many-channel
//! device into the stream and scattering the stream onto the chosen outputs allocate
//! nothing, for every sample type the device callbacks convert. Counted with the per-thread
//! counting allocator on the thread that applies them.

use netjam::endpoint::channels::{ChannelMap, MapSide};

alloc_count::install!();

#[test]
fn gathering_and_scattering_allocate_nothing() {
    let inputs = ChannelMap::parse(MapSide::Inputs, "3-4").expect("parse");
    let outputs = ChannelMap::parse(MapSide::Outputs, "5,6").expect("parse");
    const FRAMES: usize = 256;
    const DEVICE: usize = 18;
    let device_in_f32: Vec<f32> = (0..FRAMES * DEVICE).map(|i| (i % 97) as f32 / 97.0).collect();
    let device_in_i16: Vec<i16> = (0..FRAMES * DEVICE).map(|i| (i % 97) as i16).collect();
    let mut device_out_f32 = vec![0.0f32; FRAMES * DEVICE];
    let mut device_out_i32 = vec![0i32; FRAMES * DEVICE];
    let mut stream = vec![0.0f32; FRAMES * 2];
    let mut checksum = 0.0f32;

    let before = alloc_count::allocations();
    alloc_count::prove_counting();
    let mut frames = 0;
    for _ in 0..100 {
        frames += inputs.gather(&device_in_f32, DEVICE, &mut stream, |x| x);
        frames += inputs.gather(&device_in_i16, DEVICE, &mut stream, |x| f32::from(x) / 32768.0);
        // The iterator form the input bridge fills its ring from.
        checksum += inputs.gathered(&device_in_f32, DEVICE, 0.0).sum::<f32>();
        frames += outputs.scatter(&stream, &mut device_out_f32, DEVICE, 0.0, |x| x);
        frames += outputs.scatter(&stream, &mut device_out_i32, DEVICE, 0, |x| {
            (x * i32::MAX as f32) as i32
        });
    }
    let allocated = alloc_count::allocations() - before - 1;

    assert_eq!(allocated, 0, "applying a channel map allocated");
    assert_eq!(frames, 4 * 100 * FRAMES, "every call ran over every frame");
    assert!(checksum > 0.0);
    // The last scatter put input 3 of the last frame on output 5 and silenced output 1.
    let last = &device_out_f32[(FRAMES - 1) * DEVICE..];
    assert_eq!(last[4], device_in_i16[(FRAMES - 1) * DEVICE + 2] as f32 / 32768.0);
    assert_eq!(last[0], 0.0);
}
