#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    netjam_engine::privacy::fuzz::open_any(data);
});
