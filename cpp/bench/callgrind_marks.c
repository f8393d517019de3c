/* Marks for callgrind, callable from Python through ctypes (bench/binding_instructions.py):
 * zero the counts before a measured loop, dump them under the loop's name after it. Outside
 * valgrind both are a few no-op instructions.
 *
 *   cc -O2 -shared -fPIC cpp/bench/callgrind_marks.c -o /tmp/callgrind_marks.so
 */
#include <valgrind/callgrind.h>

void marks_zero(void) { CALLGRIND_ZERO_STATS; }

void marks_dump(const char* name) { CALLGRIND_DUMP_STATS_AT(name); }
