#![no_main]
//! cargo fuzz run sched (docs/fuzzing.md); the body is trn3emu_fuzz::fuzz_sched.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = trn3emu_fuzz::fuzz_sched(data);
});
