#![no_main]
//! `fabric_msg::fuzzing::atomic_message`: must not panic, hang or over-allocate.
libfuzzer_sys::fuzz_target!(|data: &[u8]| fabric_msg::fuzzing::atomic_message(data));
