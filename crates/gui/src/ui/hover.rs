//! Plot hover labels that show the curves' values under the pointer, not the pointer's
//! coordinates: near a data point, that point; elsewhere, the point of every series
//! nearest to the pointer's x.

use egui_plot::HoverPosition;

/// One named series of a plot, as drawn (x, y in the plot's units).
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<[f64; 2]>,
}

impl Series {
    pub fn new(name: impl Into<String>, points: &[[f64; 2]]) -> Series {
        Series {
            name: name.into(),
            points: points.to_vec(),
        }
    }
}

/// The point of `points` whose x is nearest to `x` (finite points only).
pub fn nearest(points: &[[f64; 2]], x: f64) -> Option<[f64; 2]> {
    points
        .iter()
        .copied()
        .filter(|p| p[0].is_finite() && p[1].is_finite())
        .min_by(|a, b| (a[0] - x).abs().total_cmp(&(b[0] - x).abs()))
}

/// The hover label of a plot drawing `series`. `x_text` and `y_text` format one
/// coordinate ("batch 8", "1.50 GiB"). Elsewhere than near a point, the label names the x
/// of the data point nearest to the pointer's x and every series' value there; `None`
/// (no label) when no series has a point.
pub fn label(
    h: &HoverPosition<'_>,
    series: &[Series],
    x_text: impl Fn(f64) -> String,
    y_text: impl Fn(f64) -> String,
) -> Option<String> {
    match h {
        HoverPosition::NearDataPoint {
            plot_name,
            position,
            ..
        } => {
            let head = if plot_name.is_empty() {
                String::new()
            } else {
                format!("{plot_name}\n")
            };
            Some(format!(
                "{head}{}\n{}",
                x_text(position.x),
                y_text(position.y)
            ))
        }
        HoverPosition::Elsewhere { position } => {
            let x = position.x;
            let at = series
                .iter()
                .filter_map(|s| nearest(&s.points, x))
                .min_by(|a, b| (a[0] - x).abs().total_cmp(&(b[0] - x).abs()))?[0];
            let mut lines = vec![x_text(at)];
            for s in series {
                // Every series with a point at that x (a phase boundary belongs to two).
                for p in s.points.iter().filter(|p| p[0] == at && p[1].is_finite()) {
                    let line = format!("{}: {}", s.name, y_text(p[1]));
                    if !lines.contains(&line) {
                        lines.push(line);
                    }
                }
            }
            Some(lines.join("\n"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use egui_plot::PlotPoint;

    fn fmt(h: &HoverPosition<'_>, series: &[Series]) -> Option<String> {
        label(h, series, |x| format!("x {x:.0}"), |y| format!("{y:.1}"))
    }

    #[test]
    fn elsewhere_shows_the_curves_at_the_nearest_x_not_the_pointer() {
        let series = [
            Series::new("a", &[[1.0, 10.0], [2.0, 20.0], [4.0, 40.0]]),
            Series::new("b", &[[1.0, 1.0], [2.0, 2.0], [4.0, 4.0]]),
        ];
        let h = HoverPosition::Elsewhere {
            position: PlotPoint::new(2.3, 99.0),
        };
        assert_eq!(fmt(&h, &series).as_deref(), Some("x 2\na: 20.0\nb: 2.0"));
        let h = HoverPosition::Elsewhere {
            position: PlotPoint::new(3.4, 0.0),
        };
        assert_eq!(fmt(&h, &series).as_deref(), Some("x 4\na: 40.0\nb: 4.0"));
    }

    #[test]
    fn near_a_point_names_it_and_no_data_gives_no_label() {
        let h = HoverPosition::NearDataPoint {
            plot_name: "a",
            position: PlotPoint::new(2.0, 20.0),
            index: 1,
        };
        assert_eq!(fmt(&h, &[]).as_deref(), Some("a\nx 2\n20.0"));
        let h = HoverPosition::Elsewhere {
            position: PlotPoint::new(2.0, 20.0),
        };
        assert_eq!(fmt(&h, &[Series::new("empty", &[])]), None);
    }
}
