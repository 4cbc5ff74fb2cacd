/* splitmix64 for the compiled parts: mocker/mixing.py's `splitmix64`, the reference (the
 * parts' differential tests compare what they draw with it). */
#ifndef MOCKER_CMIXING_H
#define MOCKER_CMIXING_H

#include <stdint.h>

#define GOLDEN 0x9E3779B97F4A7C15ull /* 2^64 / phi: splitmix64's increment */

static inline uint64_t splitmix64(uint64_t x)
{
    x += GOLDEN;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

#endif
