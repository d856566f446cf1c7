#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    netjam_engine::room::fuzz::channel_any(data);
});
