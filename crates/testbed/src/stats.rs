//! The statistics a load-balancing test needs: is the spread of N connections over k backends
//! consistent with a uniform random choice?
//!
//! Pearson's χ² statistic against the uniform expectation, its p-value from the regularized
//! upper incomplete gamma function, and critical values. A test asserts
//! `chi_square_uniform(&counts) < chi_square_critical(counts.len() - 1, 0.001)`: a correct
//! dataplane then fails once in a thousand runs, while a skewed one (an endpoint never chosen,
//! a 2:1 bias) fails every time at 600 connections.

/// Upper-tail critical values of χ² at p = 0.001 for 1..=30 degrees of freedom (index = dof - 1).
pub const CHI_SQUARE_CRITICAL_P001: [f64; 30] = [
    10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322, 26.124, 27.877, 29.588, 31.264, 32.909, 34.528, 36.123,
    37.697, 39.252, 40.790, 42.312, 43.820, 45.315, 46.797, 48.268, 49.728, 51.179, 52.620, 54.052, 55.476, 56.892,
    58.301, 59.703,
];

/// Pearson's χ² of `counts` against equal expected counts. 0 for fewer than two buckets or no
/// observations.
pub fn chi_square_uniform(counts: &[usize]) -> f64 {
    let total: usize = counts.iter().sum();
    if counts.len() < 2 || total == 0 {
        return 0.0;
    }
    let expected = total as f64 / counts.len() as f64;
    counts.iter().map(|&c| (c as f64 - expected).powi(2) / expected).sum()
}

/// P(X ≥ x) for X ~ χ²(dof): the p-value of a statistic `x`.
pub fn chi_square_p_value(x: f64, dof: usize) -> f64 {
    if dof == 0 {
        return if x > 0.0 { 0.0 } else { 1.0 };
    }
    if x <= 0.0 {
        return 1.0;
    }
    upper_regularized_gamma(dof as f64 / 2.0, x / 2.0)
}

/// The x with P(X ≥ x) = p for X ~ χ²(dof). Uses the exact table at p = 0.001 for small `dof`,
/// otherwise solves numerically.
pub fn chi_square_critical(dof: usize, p: f64) -> f64 {
    if p == 0.001
        && let Some(&value) = dof.checked_sub(1).and_then(|i| CHI_SQUARE_CRITICAL_P001.get(i))
    {
        return value;
    }
    if dof == 0 || !(0.0..1.0).contains(&p) || p == 0.0 {
        return f64::NAN;
    }
    // The survival function falls monotonically in x; bisect.
    let (mut lo, mut hi) = (0.0_f64, (dof as f64) * 10.0 + 100.0);
    for _ in 0..200 {
        let mid = (lo + hi) / 2.0;
        if chi_square_p_value(mid, dof) > p {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (lo + hi) / 2.0
}

/// ln Γ(x) for x > 0 (Lanczos approximation, g = 7, n = 9).
fn ln_gamma(x: f64) -> f64 {
    const COEFFS: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection formula.
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let t = x + 7.5;
    let series = COEFFS[1..].iter().enumerate().fold(COEFFS[0], |acc, (i, c)| acc + c / (x + i as f64 + 1.0));
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + series.ln()
}

/// Q(a, x) = Γ(a, x) / Γ(a): series below a + 1, continued fraction above.
fn upper_regularized_gamma(a: f64, x: f64) -> f64 {
    let log_prefactor = a * x.ln() - x - ln_gamma(a);
    if x < a + 1.0 {
        // P(a, x) = e^{-x} x^a / Γ(a+1) · Σ x^n / ((a+1)…(a+n))
        let (mut term, mut sum, mut denom) = (1.0 / a, 1.0 / a, a);
        for _ in 0..1000 {
            denom += 1.0;
            term *= x / denom;
            sum += term;
            if term.abs() < sum.abs() * 1e-15 {
                break;
            }
        }
        (1.0 - sum * log_prefactor.exp()).clamp(0.0, 1.0)
    } else {
        // Modified Lentz evaluation of the continued fraction for Γ(a, x).
        let tiny = 1e-300;
        let mut b = x + 1.0 - a;
        let mut c = 1.0 / tiny;
        let mut d = 1.0 / b;
        let mut h = d;
        for i in 1..1000 {
            let an = -(i as f64) * (i as f64 - a);
            b += 2.0;
            d = an * d + b;
            if d.abs() < tiny {
                d = tiny;
            }
            c = b + an / c;
            if c.abs() < tiny {
                c = tiny;
            }
            d = 1.0 / d;
            let delta = d * c;
            h *= delta;
            if (delta - 1.0).abs() < 1e-15 {
                break;
            }
        }
        (log_prefactor.exp() * h).clamp(0.0, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistic_of_a_perfect_and_a_skewed_spread() {
        assert_eq!(chi_square_uniform(&[200, 200, 200]), 0.0);
        // expected 200 each: (300-200)²/200 + (100-200)²/200 + 0 = 100
        assert!((chi_square_uniform(&[300, 100, 200]) - 100.0).abs() < 1e-9);
        assert_eq!(chi_square_uniform(&[5]), 0.0);
        assert_eq!(chi_square_uniform(&[0, 0]), 0.0);
    }

    #[test]
    fn p_values_match_known_points() {
        // χ²(1): P(X ≥ 3.841) = 0.05; χ²(2) has survival e^{-x/2}.
        assert!((chi_square_p_value(3.841_458_820_694_124, 1) - 0.05).abs() < 1e-9);
        for x in [0.5, 2.0, 9.0, 40.0] {
            assert!((chi_square_p_value(x, 2) - (-x / 2.0).exp()).abs() < 1e-12, "x = {x}");
        }
        assert_eq!(chi_square_p_value(0.0, 4), 1.0);
    }

    #[test]
    fn table_agrees_with_the_numeric_solution() {
        for (i, &table) in CHI_SQUARE_CRITICAL_P001.iter().enumerate() {
            let dof = i + 1;
            let p = chi_square_p_value(table, dof);
            assert!((p - 0.001).abs() < 2e-6, "dof {dof}: table {table} has p {p}");
            // The numeric path (p slightly off 0.001 so the table is bypassed).
            let solved = chi_square_critical(dof, 0.001 + 1e-12);
            assert!((solved - table).abs() < 2e-3, "dof {dof}: solved {solved} vs table {table}");
        }
        // Beyond the table: χ²(50) at 0.001 is 86.661.
        assert!((chi_square_critical(50, 0.001) - 86.661).abs() < 1e-2);
    }

    #[test]
    fn a_uniform_spread_passes_and_a_starved_backend_fails() {
        let critical = chi_square_critical(2, 0.001);
        assert!(chi_square_uniform(&[190, 215, 195]) < critical);
        assert!(chi_square_uniform(&[300, 300, 0]) > critical);
        assert!(chi_square_uniform(&[400, 100, 100]) > critical);
    }
}
