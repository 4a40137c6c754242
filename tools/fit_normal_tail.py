#!/usr/bin/env python3
"""Fits the polynomial of NormalCdfPdfF (ops/cpu_util.h) and prints it.

The lower tail of the standard normal distribution is written as
    Phi(-a) = e^(-a^2 / 2) * t * P(s),  s = a / (a + 4),  t = 1 - s,  a >= 0,
where P is smooth on s in [0, 14.5 / 18.5] (a in [0, 14.5], past which
e^(-a^2 / 2) underflows in float). P is interpolated at Chebyshev nodes
(mpmath's chebyfit, 50 digits) and re-expanded about the interval's middle,
so that float Horner steps add terms of falling size.

Needs mpmath (pip install mpmath). Usage: tools/fit_normal_tail.py [degree]
"""
import sys

import mpmath as mp

mp.mp.dps = 50
DEGREE = int(sys.argv[1]) if len(sys.argv) > 1 else 10
D = mp.mpf(4)
A_MAX = mp.mpf("14.5")
S_MAX = A_MAX / (A_MAX + D)
CENTER = S_MAX / 2


def p_of_s(s):
    a = D * s / (1 - s)
    tail = mp.erfc(a / mp.sqrt(2)) / 2  # Phi(-a)
    return tail * mp.exp(a * a / 2) / (1 - s)


poly, error = mp.chebyfit(p_of_s, [0, S_MAX], DEGREE + 1, error=True)  # highest power first
# Taylor shift: q(u) = p(u + CENTER).
shifted = []
for j in range(DEGREE + 1):
    shifted.append(sum(c * mp.binomial(DEGREE - i, j) * CENTER ** (DEGREE - i - j)
                       for i, c in enumerate(poly) if DEGREE - i >= j))
print("// interpolation error %s; center %.9e" % (mp.nstr(error, 3), float(CENTER)))
for c in reversed(shifted):
    print("%.9ef" % float(c))
