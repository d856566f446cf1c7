#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    netjam_engine::probe::fuzz::probe_any(data);
});
