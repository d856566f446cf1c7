#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    netjam_osc::fuzz::pattern(data);
});
