"""The report page's stylesheet and colours (colour-blind-safe Okabe-Ito hues)."""

#: the background of trained tokens (loss_mask true) in the sample viewer; used nowhere else
TRAINED_BG = "#c6ecd2"
SOURCE_COLORS = {"engine": "#009E73", "logprobs": "#0072B2", "reconstructed": "#E69F00"}
SECTIONS = {
    "quality": "Quality",
    "datasets": "Datasets",
    "samples": "Samples",
    "lengths": "Lengths",
    "loss-mask": "Loss mask",
    "exactness": "Exactness",
    "acceptance": "Acceptance",
    "truncation": "Truncation and drops",
    "cost": "Cost and throughput",
    "shards": "Shards",
    "run": "Command and manifest",
}
FINISH_COLORS = {"stop": "#009E73", "length": "#D55E00", "tool_calls": "#0072B2"}

CSS = (
    """
:root{--ink:#1f2933;--muted:#616e7c;--line:#e4e7eb;--bg:#f5f7fa;--card:#fff;--accent:#0072B2;
--ok:#1a7f37;--bad:#cf222e;--warn:#9a6700}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);
font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
main{max-width:1240px;margin:0 auto;padding:24px 20px 56px}
h1{font-size:26px;margin:0 0 2px}
h2{font-size:19px;margin:40px 0 12px;padding-bottom:6px;border-bottom:2px solid var(--line)}
h3{font-size:15px;margin:22px 0 8px}
p.lead,p.hint{color:var(--muted);margin:4px 0 12px}
a{color:var(--accent)}
nav{margin:16px 0 0;display:flex;flex-wrap:wrap;gap:6px}
nav a{padding:3px 10px;border:1px solid var(--line);border-radius:999px;background:var(--card);
text-decoration:none;font-size:13px}
.panel,.tablewrap,.kpi,.chart{background:var(--card);border:1px solid var(--line);border-radius:8px}
.panel{padding:14px 16px}
.prov{display:grid;grid-template-columns:max-content 1fr;gap:4px 16px;margin:0}
.prov dt{color:var(--muted)} .prov dd{margin:0;overflow-wrap:anywhere}
.kpis{display:grid;grid-template-columns:repeat(4,1fr);gap:12px;margin:16px 0}
@media (min-width:1100px){.kpis{grid-template-columns:repeat(8,1fr)}}
@media (max-width:560px){.kpis{grid-template-columns:repeat(2,1fr)}}
.kpi{padding:10px 14px} .kpi .v{font-size:22px;font-weight:650;font-variant-numeric:tabular-nums}
.kpi .l{color:var(--muted);font-size:12px}
.tablewrap{overflow-x:auto;margin:0 0 12px}
table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums}
th,td{padding:6px 10px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
tr:last-child td{border-bottom:0}
th{font-weight:600;color:var(--muted);font-size:12px;background:#fafbfc;white-space:nowrap}
.n{text-align:right;white-space:nowrap}
tr.total td{font-weight:600;background:#fafbfc}
td:first-child{white-space:nowrap}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(100%,380px),1fr));gap:14px}
.chart{padding:8px 10px} svg.plot{display:block;width:100%;height:auto}
.split{display:grid;grid-template-columns:minmax(0,3fr) minmax(280px,2fr);gap:14px;align-items:start;
margin:0 0 12px}
.split>div>.tablewrap:last-child{margin:0}
.split>div{min-width:0}
@media (max-width:900px){.split{grid-template-columns:minmax(0,1fr)}}
.ds{white-space:nowrap} .sw{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:7px}
.badge{display:inline-block;padding:2px 12px;border-radius:999px;font-weight:700;font-size:13px;
color:#fff;letter-spacing:.02em}
.pass{background:var(--ok)} .fail{background:var(--bad)} .forced{background:var(--warn)}
.none{background:#7b8794}
.notes{background:#fff8e5;border:1px solid #f0d48a;border-radius:8px;padding:10px 16px;margin:16px 0}
.notes ul{margin:4px 0;padding-left:20px}
code,.mono,pre{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}
pre{white-space:pre-wrap;overflow-wrap:anywhere;background:var(--bg);padding:6px 8px;
border-radius:6px;margin:2px 0}
details{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:8px 14px;
margin:0 0 8px} summary{cursor:pointer;font-weight:600}
.muted{color:var(--muted)}
footer{margin-top:40px;color:var(--muted);font-size:12px}
.alerts{background:#fdecea;border:1px solid #f1aeb5;border-radius:8px;padding:10px 16px;margin:16px 0}
.alerts ul{margin:4px 0;padding-left:20px} .alerts strong{color:var(--bad)}
.kpi .k{color:var(--warn);font-size:11px}
.legend{display:flex;flex-wrap:wrap;gap:8px;align-items:center;margin:4px 0 12px}
details.sample{padding:10px 14px;margin:0 0 10px}
details.sample summary{font-weight:400;overflow-wrap:anywhere}
details.sample[open] summary{margin:0 0 6px}
.toks{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px;
line-height:1.9;white-space:pre-wrap;overflow-wrap:anywhere}
.t{border-radius:2px}
.t:hover{outline:1px solid var(--accent);background:#dbeafe}
.t.tr{background:"""
    + TRAINED_BG
    + """}
.t.c{display:inline-block;background:#3e4c59;color:#fff;padding:0 5px;margin:0 1px;
border-radius:4px;font-size:11.5px;line-height:1.5;white-space:nowrap}
.t.c.tr{box-shadow:0 0 0 2px """
    + TRAINED_BG
    + """}
.cid{display:inline-block;margin-left:4px;padding:0 3px;border-radius:3px;background:#fff;
color:#3e4c59;font-size:10.5px}
.nl{color:#9aa5b1}
.cut{display:inline-block;color:var(--muted);font-style:italic;background:var(--bg);
border:1px dashed #cbd2d9;border-radius:4px;padding:0 6px}
.wtag{display:inline-block;background:#fff8e5;border:1px solid #f0d48a;border-radius:4px;
padding:0 6px;font-size:12px}
pre.cfg,pre.cmd{background:#f0f2f5;padding:10px 12px;white-space:pre;overflow-x:auto}
table.quality th[title]{cursor:help;text-decoration:underline dotted}
dl.checks{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:0 0 12px;
font-size:12.5px;color:var(--muted)} dl.checks dt{font-family:ui-monospace,monospace}
dl.checks dd{margin:0}
@media print{body{background:#fff} nav{display:none}}
"""
)
