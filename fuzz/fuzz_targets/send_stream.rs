#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tank_dataset::fuzz::send_stream(data));
