//! A small, seedable random source (SplitMix64) and the distributions the policies need.
//! Kept in-crate so a decision's randomness is reproducible from a seed in tests.

/// SplitMix64: fast, 64-bit state, passes BigCrush; good enough for exploration and bootstraps.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
    /// The second normal of the last Box-Muller pair, not yet used: a pair costs one `ln`,
    /// one `sqrt` and one `sin_cos`, so keeping it halves the cost of a normal (and of a
    /// Gamma draw, which the Thompson posterior draws are made of).
    spare: Option<f64>,
}

impl Rng {
    /// A generator whose sequence is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        Rng {
            state: seed ^ 0x9E37_79B9_7F4A_7C15,
            spare: None,
        }
    }

    /// Seeded from the clock and a process-wide counter.
    pub fn from_entropy() -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Rng::new(
            t.wrapping_add(
                N.fetch_add(1, Ordering::Relaxed)
                    .wrapping_mul(0xD1B5_4A32_D192_ED03),
            ),
        )
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in [0, n).
    pub fn below(&mut self, n: usize) -> usize {
        ((self.uniform() * n as f64) as usize).min(n.saturating_sub(1))
    }

    /// Standard normal (Box-Muller; both normals of a pair are used).
    pub fn normal(&mut self) -> f64 {
        if let Some(z) = self.spare.take() {
            return z;
        }
        let u1 = self.uniform().max(f64::MIN_POSITIVE);
        let u2 = self.uniform();
        let r = (-2.0 * u1.ln()).sqrt();
        let (s, c) = (std::f64::consts::TAU * u2).sin_cos();
        self.spare = Some(r * s);
        r * c
    }

    /// Gamma(shape, 1) (Marsaglia-Tsang; shape < 1 by boosting).
    pub fn gamma(&mut self, shape: f64) -> f64 {
        if shape < 1.0 {
            let u = self.uniform().max(f64::MIN_POSITIVE);
            return self.gamma(shape + 1.0) * u.powf(1.0 / shape);
        }
        let d = shape - 1.0 / 3.0;
        let c = 1.0 / (9.0 * d).sqrt();
        loop {
            let x = self.normal();
            let v = 1.0 + c * x;
            if v <= 0.0 {
                continue;
            }
            let v = v * v * v;
            let u = self.uniform();
            if u < 1.0 - 0.0331 * x * x * x * x || u.ln() < 0.5 * x * x + d * (1.0 - v + v.ln()) {
                return d * v;
            }
        }
    }

    /// Beta(a, b).
    pub fn beta(&mut self, a: f64, b: f64) -> f64 {
        let x = self.gamma(a);
        let y = self.gamma(b);
        if x + y == 0.0 {
            0.5
        } else {
            x / (x + y)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beta_has_the_right_mean() {
        let mut r = Rng::new(7);
        let n = 20_000;
        let m: f64 = (0..n).map(|_| r.beta(3.0, 7.0)).sum::<f64>() / n as f64;
        assert!((m - 0.3).abs() < 0.01, "{m}");
        let m: f64 = (0..n).map(|_| r.beta(0.5, 0.5)).sum::<f64>() / n as f64;
        assert!((m - 0.5).abs() < 0.02, "{m}");
    }

    #[test]
    fn normals_have_unit_variance_and_no_pair_correlation() {
        // Both normals of a Box-Muller pair are used: check the moments and that consecutive
        // draws (the two halves of a pair) are uncorrelated.
        let mut r = Rng::new(11);
        let n = 40_000;
        let (mut s1, mut s2, mut sxy) = (0.0, 0.0, 0.0);
        for _ in 0..n / 2 {
            let (x, y) = (r.normal(), r.normal());
            s1 += x + y;
            s2 += x * x + y * y;
            sxy += x * y;
        }
        let mean = s1 / n as f64;
        let var = s2 / n as f64 - mean * mean;
        let corr = sxy / (n / 2) as f64;
        assert!(mean.abs() < 0.02, "{mean}");
        assert!((var - 1.0).abs() < 0.03, "{var}");
        assert!(corr.abs() < 0.03, "{corr}");
    }
}
