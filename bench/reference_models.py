"""PyTorch rebuilds of reference models whose libraries are not installed, to
check the zoo's parameter counts: `python3 bench/reference_models.py NAME`
prints `NAME params: N`. Each rebuild follows its reference's layer list;
add a function and a MODELS entry per model.
"""
import argparse
import sys

import torch
import torch.nn as nn


def count_params(model):
    return sum(p.numel() for p in model.parameters())


# --- pointnet_seg: fxia22/pointnet.pytorch pointnet/model.py,
# PointNetDenseCls(k, feature_transform=True) (modules only; the forward pass
# is not needed to count parameters).
def _pointnet_stn(k):
    # STN3d (k = 3) and STNkd share this layer list; fc3 gives k*k.
    m = nn.Module()
    m.conv1, m.conv2, m.conv3 = nn.Conv1d(k, 64, 1), nn.Conv1d(64, 128, 1), nn.Conv1d(128, 1024, 1)
    m.fc1, m.fc2, m.fc3 = nn.Linear(1024, 512), nn.Linear(512, 256), nn.Linear(256, k * k)
    m.bn1, m.bn2, m.bn3 = nn.BatchNorm1d(64), nn.BatchNorm1d(128), nn.BatchNorm1d(1024)
    m.bn4, m.bn5 = nn.BatchNorm1d(512), nn.BatchNorm1d(256)
    return m


def _pointnet_feat(feature_transform=True):
    m = nn.Module()
    m.stn = _pointnet_stn(3)
    m.conv1, m.conv2, m.conv3 = nn.Conv1d(3, 64, 1), nn.Conv1d(64, 128, 1), nn.Conv1d(128, 1024, 1)
    m.bn1, m.bn2, m.bn3 = nn.BatchNorm1d(64), nn.BatchNorm1d(128), nn.BatchNorm1d(1024)
    if feature_transform:
        m.fstn = _pointnet_stn(64)
    return m


def pointnet_seg(parts=4):
    m = nn.Module()
    m.feat = _pointnet_feat(feature_transform=True)
    m.conv1, m.conv2 = nn.Conv1d(1088, 512, 1), nn.Conv1d(512, 256, 1)
    m.conv3, m.conv4 = nn.Conv1d(256, 128, 1), nn.Conv1d(128, parts, 1)
    m.bn1, m.bn2, m.bn3 = nn.BatchNorm1d(512), nn.BatchNorm1d(256), nn.BatchNorm1d(128)
    return m


# --- rnnlm, rnntc, nmt (models/rnn_models.h): FlexFlow's recurrent models
# rebuilt with torch.nn.Embedding/LSTM/Linear at loom's defaults.
# rnnlm: PyTorch examples' word_language_model RNNModel('LSTM', ntoken,
# ninp=1024, nhid=1024, nlayers=2), untied.
def rnnlm(vocab=10000, embed=1024, hidden=1024, layers=2, dropout=0.2):
    m = nn.Module()
    m.drop = nn.Dropout(dropout)
    m.encoder = nn.Embedding(vocab, embed)
    m.rnn = nn.LSTM(embed, hidden, layers, dropout=dropout)
    m.decoder = nn.Linear(hidden, vocab)
    return m


# rnntc: Embedding(vocab 32000) - LSTM(4 layers) - last step - Linear(classes).
def rnntc(classes=2, vocab=32000, embed=1024, hidden=1024, layers=4, dropout=0.2):
    m = nn.Module()
    m.embedding = nn.Embedding(vocab, embed)
    m.rnn = nn.LSTM(embed, hidden, layers, dropout=dropout)
    m.drop = nn.Dropout(dropout)
    m.fc = nn.Linear(hidden, classes)
    return m


# nmt: encoder Embedding + LSTM, decoder Embedding (one more row: the start
# token) + LSTM, OpenNMT-py's GlobalAttention(attn_type="general")
# (linear_in and linear_out without bias), generator Linear(vocab).
def nmt(vocab=20480, embed=2048, hidden=2048, layers=2, dropout=0.2):
    def side(rows):
        s = nn.Module()
        s.embedding = nn.Embedding(rows, embed)
        s.rnn = nn.LSTM(embed, hidden, layers, dropout=dropout)
        return s
    m = nn.Module()
    m.encoder = side(vocab)
    m.decoder = side(vocab + 1)
    m.attn = nn.Module()
    m.attn.linear_in = nn.Linear(hidden, hidden, bias=False)
    m.attn.linear_out = nn.Linear(2 * hidden, hidden, bias=False)
    m.generator = nn.Linear(hidden, vocab)
    return m


# --- transformer_lm (models/transformer.h): word_language_model's
# TransformerModel as HFTA's examples/transformer builds it (encoder-only):
# Embedding, sinusoidal positions (a buffer, no parameters), nn.TransformerEncoder
# of post-norm layers (no final norm), Linear decoder. HFTA's sizes.
def transformer_lm(ntoken=10000, ninp=128, nhead=2, nhid=128, nlayers=2, dropout=0.2):
    m = nn.Module()
    m.encoder = nn.Embedding(ntoken, ninp)
    layer = nn.TransformerEncoderLayer(ninp, nhead, nhid, dropout)
    m.transformer_encoder = nn.TransformerEncoder(layer, nlayers)
    m.decoder = nn.Linear(ninp, ntoken)
    return m


# --- bert_medium (models/transformer.h): HuggingFace's BertForMaskedLM
# modules (no pooler) at BERT-Medium's sizes, rebuilt with torch.nn (HF
# transformers is not installed). The MLM decoder's weight is the word
# embedding Parameter (tied), which model.parameters() yields once.
def bert_medium(vocab=30522, hidden=512, layers=8, heads=8, intermediate=2048, max_positions=512):
    def dense_ln(n_in):
        s = nn.Module()
        s.dense = nn.Linear(n_in, hidden)
        s.LayerNorm = nn.LayerNorm(hidden, eps=1e-12)
        s.dropout = nn.Dropout(0.1)
        return s

    def bert_layer():
        l = nn.Module()
        l.attention = nn.Module()
        l.attention.self = nn.Module()
        for proj in ("query", "key", "value"):
            setattr(l.attention.self, proj, nn.Linear(hidden, hidden))
        l.attention.output = dense_ln(hidden)
        l.intermediate = nn.Module()
        l.intermediate.dense = nn.Linear(hidden, intermediate)
        l.output = dense_ln(intermediate)
        return l

    m = nn.Module()
    m.bert = nn.Module()
    e = m.bert.embeddings = nn.Module()
    e.word_embeddings = nn.Embedding(vocab, hidden, padding_idx=0)
    e.position_embeddings = nn.Embedding(max_positions, hidden)
    e.token_type_embeddings = nn.Embedding(2, hidden)
    e.LayerNorm = nn.LayerNorm(hidden, eps=1e-12)
    m.bert.encoder = nn.Module()
    m.bert.encoder.layer = nn.ModuleList([bert_layer() for _ in range(layers)])
    m.cls = nn.Module()
    p = m.cls.predictions = nn.Module()
    p.transform = dense_ln(hidden)
    p.decoder = nn.Linear(hidden, vocab, bias=False)
    p.decoder.weight = e.word_embeddings.weight  # tied
    p.bias = nn.Parameter(torch.zeros(vocab))
    p.decoder.bias = p.bias
    return m


MODELS = {
    "transformer_lm": transformer_lm,
    "bert_medium": bert_medium,
    "rnnlm": rnnlm,
    "rnntc": rnntc,
    "nmt": nmt,
    "pointnet_seg": pointnet_seg,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("name", choices=sorted(MODELS))
    parser.add_argument("--classes", type=int, default=None, help="classes (or parts) where the model takes them")
    args = parser.parse_args()
    build = MODELS[args.name]
    model = build(args.classes) if args.classes is not None else build()
    print(f"{args.name} params: {count_params(model)}")


if __name__ == "__main__":
    sys.exit(main())
