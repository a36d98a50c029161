// plasma/compat.h: Plasma shipped this header for macOS's thread types;
// ferroplasma's Plasma compatibility headers keep it so that programs that
// include it build unchanged. It declares nothing.
#ifndef FERROPLASMA_PLASMA_COMPAT_H
#define FERROPLASMA_PLASMA_COMPAT_H
#endif  // FERROPLASMA_PLASMA_COMPAT_H
