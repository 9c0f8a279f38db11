"""A loss of your own: the Huber loss of a regression head (squared near the label, linear far from
it). Named in params.yaml's `modules:` and chosen by name: `heads: {losses: {sst_score: huber}}`."""
from minbert.core.register import Loss, register_loss


@register_loss
class Huber(Loss):
    name = "huber"                 # what params call it
    kinds = ("regression",)        # the tasks it trains: a score
    batch_statistic = False        # row by row: any batch size will do
    calibrate = False              # it trains the outputs onto the labels' scale

    def __call__(self, output, target, pair=None):
        import torch.nn.functional as F

        return F.huber_loss(output.float(), target.float(), delta=0.1)
