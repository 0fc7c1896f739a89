package report

import (
	"math"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
)

// textSlack is how much wider than Liberation Sans the browser's font may
// be. gonum lays the plot out with the widths of the font it measures, but
// the browser draws the SVG's text with whatever font it has: the page asks
// for Liberation Sans or its metric twins (Arimo, Arial, Helvetica), and a
// machine without them falls back to a sans serif such as DejaVu Sans, up
// to ~18% wider. Measuring text this much wider keeps labels off the axes
// and inside the picture either way.
const textSlack = 1.2

// sansFont is Liberation Sans at size points, which the page's CSS maps to
// metric-compatible fonts (report.html.tmpl, .plot svg text).
func sansFont(size vg.Length) font.Font {
	f := plot.DefaultFont
	f.Variant = "Sans"
	return font.From(f, size)
}

// slackText is gonum's plain text handler with every width textSlack
// times larger, for layout and for aligning the text it draws: a
// right-aligned tick label starts further left, so a wider font grows into
// the space left for it instead of into the axis.
type slackText struct{ text.Plain }

func (h slackText) Box(txt string, fnt font.Font) (width, height, depth vg.Length) {
	w, ht, d := h.Plain.Box(txt, fnt)
	return w * textSlack, ht, d
}

// Draw is text.Plain.Draw with the slack width in the alignment offset.
func (h slackText) Draw(c vg.Canvas, txt string, sty text.Style, pt vg.Point) {
	txt = strings.TrimRight(txt, "\n")
	if txt == "" {
		return
	}
	fnt := h.Fonts.Lookup(sty.Font, sty.Font.Size)
	c.SetColor(sty.Color)
	if sty.Rotation != 0 {
		c.Push()
		c.Rotate(sty.Rotation)
	}
	sin64, cos64 := math.Sincos(sty.Rotation)
	sin, cos := vg.Length(sin64), vg.Length(cos64)
	pt.X, pt.Y = pt.Y*sin+pt.X*cos, pt.Y*cos-pt.X*sin
	lines := h.Lines(txt)
	pt.Y += sty.Height(txt)*vg.Length(sty.YAlign) - fnt.Extents().Ascent
	for i, line := range lines {
		xoff := vg.Length(sty.XAlign) * fnt.Width(line) * textSlack
		n := vg.Length(len(lines) - i)
		c.FillString(fnt, pt.Add(vg.Point{X: xoff, Y: n * sty.Font.Size}), line)
	}
	if sty.Rotation != 0 {
		c.Pop()
	}
}

// useSlackText sets every text of p to Liberation Sans measured with slack.
func useSlackText(p *plot.Plot) {
	h := slackText{text.Plain{Fonts: font.DefaultCache}}
	p.TextHandler = h
	for _, s := range []*text.Style{&p.Title.TextStyle, &p.X.Label.TextStyle, &p.Y.Label.TextStyle, &p.X.Tick.Label, &p.Y.Tick.Label} {
		s.Font = sansFont(s.Font.Size)
		s.Handler = h
	}
}
