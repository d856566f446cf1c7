#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    netjam_engine::wire::fuzz::parse_any(data);
});
