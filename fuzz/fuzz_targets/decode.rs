#![no_main]
//! cargo fuzz run decode (docs/fuzzing.md); the body is trn3emu_fuzz::fuzz_decode.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    trn3emu_fuzz::fuzz_decode(data);
});
